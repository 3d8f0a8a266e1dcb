package mq

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// natsGoDelivery is nats.go's own reading of an ack subject, the reference for
// parseDelivery.
func natsGoDelivery(reply string) (delivery, bool) {
	meta, err := (&nats.Msg{Reply: reply, Sub: &nats.Subscription{}}).Metadata()
	if err != nil {
		return delivery{}, false
	}
	return delivery{streamSeq: meta.Sequence.Stream, consumerSeq: meta.Sequence.Consumer,
		numDelivered: meta.NumDelivered, timestamp: meta.Timestamp}, true
}

// Both forms the server sends, with every field where nats.go reads it, and a v2
// subject with tokens a later server may add after the pending count.
func TestParseDelivery_ReadsBothAckSubjectFormsAsNatsGoDoes(t *testing.T) {
	ts := time.Date(2026, 12, 7, 9, 30, 0, 123456789, time.UTC).UnixNano()
	for _, reply := range []string{
		"$JS.ACK.WH_INGEST_0.wh-ingest.3.1042.977." + strconv.FormatInt(ts, 10) + ".12",
		"$JS.ACK._.ACCHASH.WH_INGEST_0.wh-ingest.3.1042.977." + strconv.FormatInt(ts, 10) + ".12.rAnd0m",
		"$JS.ACK.hub.ACCHASH.WH_INGEST_7.wh-ingest.1.18446744073709551615.1.1.0.XyZ",
		"$JS.ACK.hub.ACCHASH.WH_INGEST_7.wh-ingest.1.5.1.1.0.XyZ.more.tokens",
		"$JS.ACK.hub.ACCHASH.WH_INGEST_7.wh-ingest.1.5.1.1.0",
	} {
		want, ok := natsGoDelivery(reply)
		require.True(t, ok, reply)
		got, ok := parseDelivery(reply)
		require.True(t, ok, reply)
		require.Equal(t, want.streamSeq, got.streamSeq, reply)
		require.Equal(t, want.consumerSeq, got.consumerSeq, reply)
		require.Equal(t, want.numDelivered, got.numDelivered, reply)
		require.True(t, want.timestamp.Equal(got.timestamp), reply)
	}
}

// A number nats.go would read otherwise is refused in every position: nats.go wraps a
// sequence past 2^64-1 round to a small one and reads a stray character as 0, so the
// fuzz test's comparison with it cannot catch a parser that does the same.
func TestParseDelivery_RefusesANumberNoUint64HoldsInEveryPosition(t *testing.T) {
	for _, bad := range []string{"18446744073709551616", "99999999999999999999", "+1", "-1", "", "1_0", "0x1", " 1", "1e3"} {
		for pos := range 4 {
			nums := []string{"1", "2", "3", "4"}
			nums[pos] = bad
			for _, reply := range []string{
				"$JS.ACK.S.c." + strings.Join(nums, ".") + ".0",
				"$JS.ACK._.HASH.S.c." + strings.Join(nums, ".") + ".0.tok",
			} {
				_, ok := parseDelivery(reply)
				require.False(t, ok, "accepted %q", reply)
			}
		}
	}
	got, ok := parseDelivery("$JS.ACK.S.c.1.18446744073709551615.00000000000000000000000003.4.0")
	require.True(t, ok)
	require.Equal(t, uint64(18446744073709551615), got.streamSeq, "the largest uint64 is read")
	require.Equal(t, uint64(3), got.consumerSeq, "leading zeros beyond 19 digits are read, as ParseUint does")
}

// decimal is strconv.ParseUint(s, 10, 64), whatever s.
func FuzzDecimal_ReadsAsParseUintDoes(f *testing.F) {
	for _, seed := range []string{"", "0", "18446744073709551615", "18446744073709551616", "0000000000000000000000001", "+1", "1a"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := decimal(s)
		want, err := strconv.ParseUint(s, 10, 64)
		require.Equal(t, err == nil, ok, "%q", s)
		if ok {
			require.Equal(t, want, got, "%q", s)
		}
	})
}

// What is not an ack subject is refused, never read as one, and never panics: a
// worker that took a wrong sequence would order or settle the wrong event.
func FuzzParseDelivery_NeverAcceptsWhatNatsGoRefusesOrReadsItOtherwise(f *testing.F) {
	for _, seed := range []string{
		"", "$JS.ACK.", "$JS.ACK", "$JS.ACK.s.c.1.2.3.4", "$JS.ACK.s.c.1.2.3.4.5.6",
		"$JS.ACK.s.c.1.2.3.4.5", "$JS.NAK.s.c.1.2.3.4.5", "_INBOX.abc", "$JS.ACK.s.c.x.2.3.4.5",
		"$JS.ACK.s.c.1.-2.3.4.5", "$JS.ACK.s.c.1.2.3.4.99999999999999999999", "$JS.ACK.s.c..2.3.4.5",
		"$JS.ACK.d.h.s.c.1.2.3.4.5.t", "$JS.ACK.d.h.s.c.1.2.3.4.5.", "$JS.ACK.d.h.s.c.1.2.3.4.5..",
		"$JS.ACK.s.c.1.2.3.4.5.", "$JS.ACK..........", "$js.ack.s.c.1.2.3.4.5",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, reply string) {
		got, ok := parseDelivery(reply)
		if !ok {
			return
		}
		want, wantOK := natsGoDelivery(reply)
		require.True(t, wantOK, "accepted what nats.go refuses: %q", reply)
		require.Equal(t, want.streamSeq, got.streamSeq, reply)
		require.Equal(t, want.consumerSeq, got.consumerSeq, reply)
		require.Equal(t, want.numDelivered, got.numDelivered, reply)
		require.True(t, want.timestamp.Equal(got.timestamp), reply)
	})
}
