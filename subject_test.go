package mq

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
)

// These tests use only the standard library: testify's assert package imports
// go.yaml.in/yaml/v3, which go.sum does not list.

// subjHardNames are table and scope names that need escaping, or sit on its edges.
var subjHardNames = []string{
	"events",
	"default.clicks",
	"a.b",
	"a..b",
	".",
	"..",
	".leading",
	"trailing.",
	"*",
	">",
	"a.*",
	"a.>",
	"a b",
	" ",
	"%",
	"%2E",
	"%25",
	"a%2Eb",
	"/",
	"a/b",
	"\\",
	"é",
	"日本語",
	"🙂",
	"\xff\xfe",
	"\xc3",
	"\x00",
	"a\x00b",
	"\t",
	"a\tb\nc\r",
	"\x7f",
	"A-Z_b",
	"-",
	"_",
	"~+!$&'()[]{}",
	"0",
}

// subjNamesWithNone is subjHardNames plus "" (no scope).
func subjNamesWithNone() []string { return append([]string{""}, subjHardNames...) }

// subjFNV1a32 is FNV-1a over 32 bits, written out here so the test does not share the
// implementation's hash/fnv.
func subjFNV1a32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// subjShort quotes s for a failure message, cut to its first 64 bytes.
func subjShort(s string) string {
	if len(s) <= 64 {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:64]) + "... (" + strconv.Itoa(len(s)) + " bytes)"
}

// subjCheckTail reports why key cannot follow "<prefix>.ingest.<p>." in a NATS subject
// (an empty token, a wildcard, whitespace or a control byte), or "" if it can.
func subjCheckTail(key string) string {
	if key == "" {
		return "empty key"
	}
	for i, tok := range strings.Split(key, ".") {
		if tok == "" {
			return "token " + strconv.Itoa(i) + " is empty"
		}
		for j := 0; j < len(tok); j++ {
			if c := tok[j]; c == '*' || c == '>' || c <= ' ' || c >= 0x7f {
				return "token " + strconv.Quote(tok) + " has byte " + strconv.QuoteRune(rune(c)) + " at " + strconv.Itoa(j)
			}
		}
	}
	return ""
}

func TestTenantIDValidate_AcceptsLowercaseAlnumThenUnderscoreOrDash(t *testing.T) {
	for _, id := range []TenantID{
		"0", "a", "acme", "acme-co", "a_b", "a-", "a_", "9lives", "a--b__c",
		TenantID(strings.Repeat("a", 64)),
		TenantID("0" + strings.Repeat("-", 63)),
	} {
		if err := id.Validate(); err != nil {
			t.Errorf("TenantID(%q).Validate() = %v, want nil", id, err)
		}
	}
}

func TestTenantIDValidate_RefusesOutsideTheGrammarNamingTheOffendingByte(t *testing.T) {
	cases := []struct {
		id   TenantID
		want string // the part of the message that names the fault
	}{
		{"", "empty"},
		{"A", "'A' at index 0"},
		{"Acme", "'A' at index 0"},
		{"acMe", "'M' at index 2"},
		{"-a", "'-' at index 0"},
		{"_a", "'_' at index 0"},
		{"a.b", "'.' at index 1"},
		{"*", "'*' at index 0"},
		{">", "'>' at index 0"},
		{"a b", "' ' at index 1"},
		{"a/b", "'/' at index 1"},
		{"a%b", "'%' at index 1"},
		{"a\x00", "0x00 at index 1"},
		{"é", "0xc3 at index 0"},
		{TenantID(strings.Repeat("a", 65)), "65 bytes"},
	}
	for _, c := range cases {
		t.Run(strconv.Quote(string(c.id)), func(t *testing.T) {
			err := c.id.Validate()
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			if !errors.Is(err, ErrInvalidTenant) {
				t.Errorf("error %v does not wrap ErrInvalidTenant", err)
			}
			if errors.Is(err, ErrInvalidTopic) {
				t.Errorf("a tenant error %v wraps ErrInvalidTopic", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name the fault %q", err, c.want)
			}
		})
	}
}

func TestTopicKey_PinsTheEscapedForm(t *testing.T) {
	cases := []struct {
		topic Topic
		key   string
	}{
		{Topic{Tenant: "acme-co", Table: "default.clicks", Scope: "org_1"}, "acme-co.default%2Eclicks.org_1"},
		{Topic{Tenant: "0", Table: "events"}, "0.events"},
		{Topic{Tenant: "0", Table: "a.b"}, "0.a%2Eb"},
		{Topic{Tenant: "0", Table: "a", Scope: "b"}, "0.a.b"},
		{Topic{Tenant: "0", Table: "*"}, "0.%2A"},
		{Topic{Tenant: "0", Table: ">"}, "0.%3E"},
		{Topic{Tenant: "0", Table: "a b"}, "0.a%20b"},
		{Topic{Tenant: "0", Table: "%"}, "0.%25"},
		{Topic{Tenant: "0", Table: "%2E"}, "0.%252E"},
		{Topic{Tenant: "0", Table: "a/b"}, "0.a%2Fb"},
		{Topic{Tenant: "0", Table: "é"}, "0.%C3%A9"},
		{Topic{Tenant: "0", Table: "日"}, "0.%E6%97%A5"},
		{Topic{Tenant: "0", Table: "\xff\xfe"}, "0.%FF%FE"},
		{Topic{Tenant: "0", Table: "a\x00b"}, "0.a%00b"},
		{Topic{Tenant: "0", Table: "\t\n\r"}, "0.%09%0A%0D"},
		{Topic{Tenant: "0", Table: "\x7f"}, "0.%7F"},
		{Topic{Tenant: "0", Table: "A-Z_b09"}, "0.A-Z_b09"},
		{Topic{Tenant: "0", Table: "~+"}, "0.%7E%2B"},
		{Topic{Tenant: "0", Table: "t", Scope: "x.y z"}, "0.t.x%2Ey%20z"},
		{Topic{Tenant: "0", Table: "t", Scope: "*"}, "0.t.%2A"},
	}
	for _, c := range cases {
		t.Run(strconv.Quote(c.key), func(t *testing.T) {
			key, err := c.topic.Key()
			if err != nil {
				t.Fatalf("Key() of %#v: %v", c.topic, err)
			}
			if key != c.key {
				t.Errorf("Key() of %#v = %q, want %q", c.topic, key, c.key)
			}
			if err := c.topic.Validate(); err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
			if s := c.topic.String(); s != c.key {
				t.Errorf("String() = %q, want the key %q", s, c.key)
			}
			if why := subjCheckTail(key); why != "" {
				t.Errorf("key %q is not a subject tail: %s", key, why)
			}
		})
	}
}

func TestTopicKey_EveryTokenOfEveryHardNameIsAValidSubjectToken(t *testing.T) {
	for _, table := range subjHardNames {
		for _, scope := range subjNamesWithNone() {
			topic := Topic{Tenant: "acme-co", Table: table, Scope: scope}
			key, err := topic.Key()
			if err != nil {
				t.Fatalf("Key() of %#v: %v", topic, err)
			}
			if why := subjCheckTail(key); why != "" {
				t.Errorf("key %q of %#v is not a subject tail: %s", key, topic, why)
			}
			want := 3
			if scope == "" {
				want = 2
			}
			if n := len(strings.Split(key, ".")); n != want {
				t.Errorf("key %q of %#v has %d tokens, want %d", key, topic, n, want)
			}
		}
	}
}

func TestTopicKey_ADottedTableNeverEqualsATableWithAScope(t *testing.T) {
	dotted, err := Topic{Tenant: "acme", Table: "a.b"}.Key()
	if err != nil {
		t.Fatal(err)
	}
	scoped, err := Topic{Tenant: "acme", Table: "a", Scope: "b"}.Key()
	if err != nil {
		t.Fatal(err)
	}
	if dotted == scoped {
		t.Fatalf("table \"a.b\" and table \"a\" scope \"b\" share key %q", dotted)
	}
	if dotted != "acme.a%2Eb" || scoped != "acme.a.b" {
		t.Errorf("keys %q and %q, want \"acme.a%%2Eb\" and \"acme.a.b\"", dotted, scoped)
	}
}

func TestTopicKey_TenantAndTableAreNotInterchangeable(t *testing.T) {
	ab, err := Topic{Tenant: "a", Table: "b"}.Key()
	if err != nil {
		t.Fatal(err)
	}
	ba, err := Topic{Tenant: "b", Table: "a"}.Key()
	if err != nil {
		t.Fatal(err)
	}
	if ab == ba {
		t.Fatalf("tenant a table b and tenant b table a share key %q", ab)
	}
}

func TestTopicKey_DistinctHardTopicsHaveDistinctKeys(t *testing.T) {
	seen := make(map[string]Topic)
	for _, tenant := range []TenantID{"a", "b", "0", "a-b"} {
		for _, table := range subjHardNames {
			for _, scope := range subjNamesWithNone() {
				topic := Topic{Tenant: tenant, Table: table, Scope: scope}
				key, err := topic.Key()
				if err != nil {
					t.Fatalf("Key() of %#v: %v", topic, err)
				}
				if prev, dup := seen[key]; dup {
					t.Fatalf("topics %#v and %#v share key %q", prev, topic, key)
				}
				seen[key] = topic
			}
		}
	}
}

func TestTopicKey_AnEmptyScopeIsOmitted(t *testing.T) {
	key, err := Topic{Tenant: "acme", Table: "t", Scope: ""}.Key()
	if err != nil {
		t.Fatal(err)
	}
	if key != "acme.t" {
		t.Errorf("key %q, want \"acme.t\"", key)
	}
	back, err := ParseTopicKey(key)
	if err != nil || back != (Topic{Tenant: "acme", Table: "t"}) {
		t.Errorf("ParseTopicKey(%q) = %#v, %v", key, back, err)
	}
}

func TestTopicKey_AcceptsAKeyOfExactlyTheLimit(t *testing.T) {
	for _, topic := range []Topic{
		// "t." is 2 bytes, so a kept table of 2046 bytes makes a 2048-byte key.
		{Tenant: "t", Table: strings.Repeat("x", 2046)},
		// 682 dots escape to 2046 bytes.
		{Tenant: "t", Table: strings.Repeat(".", 682)},
		// "t.x." is 4 bytes.
		{Tenant: "t", Table: "x", Scope: strings.Repeat("y", 2044)},
	} {
		key, err := topic.Key()
		if err != nil {
			t.Fatalf("Key() of a %d-byte table, %d-byte scope: %v", len(topic.Table), len(topic.Scope), err)
		}
		if len(key) != 2048 {
			t.Errorf("key is %d bytes, want 2048", len(key))
		}
		back, err := ParseTopicKey(key)
		if err != nil || back != topic {
			t.Errorf("the 2048-byte key does not round trip: %v", err)
		}
	}
}

func TestTopicKey_LongNamesUnderTheLimitRoundTrip(t *testing.T) {
	long := Topic{
		Tenant: TenantID(strings.Repeat("z", 64)),
		Table:  strings.Repeat("日", 100),
		Scope:  strings.Repeat("s", 500) + "\xff",
	}
	key, err := long.Key()
	if err != nil {
		t.Fatal(err)
	}
	if want := 64 + 1 + 900 + 1 + 503; len(key) != want {
		t.Errorf("key is %d bytes, want %d", len(key), want)
	}
	if why := subjCheckTail(key); why != "" {
		t.Errorf("long key is not a subject tail: %s", why)
	}
	back, err := ParseTopicKey(key)
	if err != nil || back != long {
		t.Errorf("long key does not round trip: %v", err)
	}
}

func TestTopicKey_RefusesAKeyOverTheLimitNamingItsLength(t *testing.T) {
	cases := []struct {
		topic  Topic
		length int
	}{
		{Topic{Tenant: "t", Table: strings.Repeat("x", 2047)}, 2049},
		{Topic{Tenant: "t", Table: strings.Repeat(".", 683)}, 2051},
		{Topic{Tenant: "t", Table: "x", Scope: strings.Repeat("y", 2045)}, 2049},
		{Topic{Tenant: "t", Table: strings.Repeat("é", 1000)}, 6002},
	}
	for _, c := range cases {
		key, err := c.topic.Key()
		if err == nil {
			t.Fatalf("Key() of a %d-byte key = nil error", c.length)
		}
		if key != "" {
			t.Errorf("a refused key is %d bytes, want empty", len(key))
		}
		if !errors.Is(err, ErrInvalidTopic) {
			t.Errorf("error %v does not wrap ErrInvalidTopic", err)
		}
		if errors.Is(err, ErrInvalidTenant) {
			t.Errorf("a length error %v wraps ErrInvalidTenant", err)
		}
		if msg := err.Error(); !strings.Contains(msg, strconv.Itoa(c.length)+" bytes") || !strings.Contains(msg, "2048") {
			t.Errorf("error %q does not name the length %d and the limit 2048", msg, c.length)
		}
		if err := c.topic.Validate(); !errors.Is(err, ErrInvalidTopic) {
			t.Errorf("Validate() = %v, want ErrInvalidTopic", err)
		}
	}
}

func TestTopicKey_RefusesATopicWithoutAValidTenantOrTable(t *testing.T) {
	cases := []struct {
		name   string
		topic  Topic
		tenant bool // the fault is the tenant's
	}{
		{"empty tenant", Topic{Table: "t"}, true},
		{"uppercase tenant", Topic{Tenant: "Acme", Table: "t"}, true},
		{"dotted tenant", Topic{Tenant: "a.b", Table: "t"}, true},
		{"wildcard tenant", Topic{Tenant: "*", Table: "t"}, true},
		{"long tenant", Topic{Tenant: TenantID(strings.Repeat("a", 65)), Table: "t"}, true},
		{"zero topic", Topic{}, true},
		{"empty table", Topic{Tenant: "acme"}, false},
		{"empty table with a scope", Topic{Tenant: "acme", Scope: "s"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key, err := c.topic.Key()
			if err == nil {
				t.Fatalf("Key() = %q, nil; want an error", key)
			}
			if key != "" {
				t.Errorf("a refused topic has key %q", key)
			}
			if !errors.Is(err, ErrInvalidTopic) {
				t.Errorf("error %v does not wrap ErrInvalidTopic", err)
			}
			if got := errors.Is(err, ErrInvalidTenant); got != c.tenant {
				t.Errorf("errors.Is(%v, ErrInvalidTenant) = %v, want %v", err, got, c.tenant)
			}
			if !c.tenant && !strings.Contains(err.Error(), "empty table") {
				t.Errorf("error %q does not name the empty table", err)
			}
			if err := c.topic.Validate(); !errors.Is(err, ErrInvalidTopic) {
				t.Errorf("Validate() = %v, want ErrInvalidTopic", err)
			}
		})
	}
}

func TestTopicString_ShowsAnInvalidTopicReadably(t *testing.T) {
	got := Topic{Tenant: "Acme", Table: "a.b", Scope: "\xff"}.String()
	if want := `{tenant "Acme" table "a.b" scope "\xff"}`; got != want {
		t.Errorf("String() = %s, want %s", got, want)
	}
}

func TestParseTopicKey_RoundTripsEveryHardName(t *testing.T) {
	for _, tenant := range []TenantID{"0", "acme-co", TenantID(strings.Repeat("a", 64))} {
		for _, table := range subjHardNames {
			for _, scope := range subjNamesWithNone() {
				topic := Topic{Tenant: tenant, Table: table, Scope: scope}
				key, err := topic.Key()
				if err != nil {
					t.Fatalf("Key() of %#v: %v", topic, err)
				}
				back, err := ParseTopicKey(key)
				if err != nil {
					t.Fatalf("ParseTopicKey(%q): %v", key, err)
				}
				if back != topic {
					t.Fatalf("ParseTopicKey(%q) = %#v, want %#v", key, back, topic)
				}
			}
		}
	}
}

func TestParseTopicKey_PinsTheDecodedForm(t *testing.T) {
	cases := map[string]Topic{
		"0.events":                       {Tenant: "0", Table: "events"},
		"acme-co.default%2Eclicks.org_1": {Tenant: "acme-co", Table: "default.clicks", Scope: "org_1"},
		"a.%25":                          {Tenant: "a", Table: "%"},
		"a.%252E":                        {Tenant: "a", Table: "%2E"},
		"a.%FF%FE":                       {Tenant: "a", Table: "\xff\xfe"},
		"a.%00":                          {Tenant: "a", Table: "\x00"},
		"a.Ab-_.%2A":                     {Tenant: "a", Table: "Ab-_", Scope: "*"},
		"a.x%2Ey%20z":                    {Tenant: "a", Table: "x.y z"},
	}
	for key, want := range cases {
		got, err := ParseTopicKey(key)
		if err != nil || got != want {
			t.Errorf("ParseTopicKey(%q) = %#v, %v; want %#v", key, got, err, want)
		}
	}
}

func TestParseTopicKey_RefusesKeysThisPackageCouldNotHaveWritten(t *testing.T) {
	for _, key := range []string{
		"",
		"a",
		".events",
		"a.b.c.d",
		"a.b.c.d.e",
		"A.x",
		"-a.x",
		"a*.x",
		strings.Repeat("a", 65) + ".x",
		"a.%",
		"a.%2",
		"a.x%",
		"a.x%2",
		"a.%2G",
		"a.%G2",
		"a.%2e",     // lowercase hex: the writer only writes uppercase
		"a.%c3",     // lowercase hex
		"a.%41",     // 'A' is kept as itself, never escaped
		"a.%61",     // 'a'
		"a.%30",     // '0'
		"a.%2D",     // '-' (the older encodeToken form)
		"a.%5F",     // '_'
		"a.x y",     // a raw byte that would have been escaped
		"a.x+y",     // likewise
		"a.%20 ",    // likewise, after an escape
		"a.+2E",     // a raw byte followed by hex digits is not an escape
		"a.%2E+2E",  // likewise, in a token that has an escape
		"a.%20x 20", // likewise
		"a.é",       // raw non-ASCII
		"a.*",
		"a.>",
		"a.t.*",
		"a.t.%2e",
		"a.",
		"a.b.",
		"a..b",
		"a.%%41",
		"a.%-1",
	} {
		t.Run(strconv.Quote(key), func(t *testing.T) {
			topic, err := ParseTopicKey(key)
			if err == nil {
				t.Fatalf("ParseTopicKey(%q) = %#v, nil; want an error", key, topic)
			}
			if !errors.Is(err, ErrInvalidTopic) {
				t.Errorf("error %v does not wrap ErrInvalidTopic", err)
			}
			if topic != (Topic{}) {
				t.Errorf("a refused key decoded to %#v", topic)
			}
		})
	}
}

// A key longer than the limit is one Topic.Key never writes, so it is foreign.
// (Found by FuzzParseTopicKey's length seed.)
func TestParseTopicKey_RefusesAKeyLongerThanTheLimit(t *testing.T) {
	for _, key := range []string{
		"t." + strings.Repeat("x", 2047),
		"t.x." + strings.Repeat("y", 2045),
		"t." + strings.Repeat("%2E", 683),
	} {
		topic, err := ParseTopicKey(key)
		if !errors.Is(err, ErrInvalidTopic) {
			t.Errorf("ParseTopicKey of a %d-byte key = %v, want ErrInvalidTopic: Topic.Key refuses the decoded topic", len(key), err)
		}
		if err == nil {
			if _, kerr := topic.Key(); kerr == nil {
				t.Errorf("the decoded topic has a key again")
			}
		}
	}
}

func TestParseTopicKey_ATenantFaultAlsoWrapsErrInvalidTenant(t *testing.T) {
	_, err := ParseTopicKey("Acme.t")
	if !errors.Is(err, ErrInvalidTopic) || !errors.Is(err, ErrInvalidTenant) {
		t.Errorf("ParseTopicKey(\"Acme.t\") = %v, want ErrInvalidTopic and ErrInvalidTenant", err)
	}
	_, err = ParseTopicKey("acme.%2e")
	if !errors.Is(err, ErrInvalidTopic) || errors.Is(err, ErrInvalidTenant) {
		t.Errorf("ParseTopicKey(\"acme.%%2e\") = %v, want ErrInvalidTopic only", err)
	}
}

func TestMessageTopic_DecodesTheKeyOfAValidTopic(t *testing.T) {
	for _, topic := range []Topic{
		{Tenant: "acme-co", Table: "default.clicks", Scope: "org_1"},
		{Tenant: "0", Table: "\xff\xfe", Scope: "a b"},
		{Tenant: "0", Table: "events"},
	} {
		m := NewMessage(context.Background(), topic, []byte("x"))
		key, err := topic.Key()
		if err != nil {
			t.Fatal(err)
		}
		if m.TopicKey() != key {
			t.Errorf("TopicKey() = %q, want %q", m.TopicKey(), key)
		}
		if got := m.Topic(); got != topic {
			t.Errorf("Topic() = %#v, want %#v", got, topic)
		}
		if string(m.Data) != "x" {
			t.Errorf("Data = %q, want \"x\"", m.Data)
		}
	}
}

func TestMessageTopic_AForeignKeyBecomesATableOfTheWholeKey(t *testing.T) {
	for _, key := range []string{"A.x", "a.b.c.d", "a.%2e", "orders", ".events", "wh.other.a.t"} {
		var noCtx context.Context // a nil context is replaced
		m := newKeyedMessage(noCtx, key, nil)
		if m.TopicKey() != key {
			t.Errorf("TopicKey() = %q, want %q", m.TopicKey(), key)
		}
		if got, want := m.Topic(), (Topic{Table: key}); got != want {
			t.Errorf("Topic() of foreign key %q = %#v, want %#v", key, got, want)
		}
		if m.Ctx == nil {
			t.Errorf("a message built with a nil context has a nil Ctx")
		}
	}
}

func TestNewMessage_AnInvalidTopicHasAnEmptyKey(t *testing.T) {
	m := NewMessage(context.Background(), Topic{Tenant: "Bad", Table: "t"}, nil)
	if m.TopicKey() != "" {
		t.Errorf("TopicKey() = %q, want empty", m.TopicKey())
	}
	if got := m.Topic(); got != (Topic{}) {
		t.Errorf("Topic() = %#v, want the zero topic", got)
	}
}

func TestPartition_HandWrittenFNV1aMatchesPublishedVectors(t *testing.T) {
	// Published FNV-1a 32 test vectors, to trust the reference below.
	for s, want := range map[string]uint32{"": 0x811c9dc5, "a": 0xe40c292c, "foobar": 0xbf9cf968} {
		if got := subjFNV1a32(s); got != want {
			t.Errorf("fnv1a32(%q) = %#x, want %#x", s, got, want)
		}
	}
}

func TestPartition_IsFNV1a32ModuloN(t *testing.T) {
	// Values computed outside Go.
	pinned := []struct {
		tenant TenantID
		n      int
		want   int
	}{
		{"a", 4, 0}, {"a", 7, 5}, {"a", 16, 12},
		{"acme", 4, 3}, {"acme", 7, 5}, {"acme", 16, 15},
		{"acme-co", 4, 0}, {"acme-co", 7, 3},
		{"0", 3, 0}, {"0", 4, 3}, {"0", 16, 15},
		{"tenant-42", 4, 2}, {"tenant-42", 3, 0},
		{"foobar", 16, 8},
	}
	for _, c := range pinned {
		if got := Partition(c.tenant, c.n); got != c.want {
			t.Errorf("Partition(%q, %d) = %d, want %d", c.tenant, c.n, got, c.want)
		}
	}
	for i := range 500 {
		tenant := TenantID("t" + strconv.Itoa(i))
		for _, n := range []int{2, 3, 4, 7, 16, 1000, 1 << 20} {
			if got, want := Partition(tenant, n), int(subjFNV1a32(string(tenant))%uint32(n)); got != want {
				t.Fatalf("Partition(%q, %d) = %d, want %d", tenant, n, got, want)
			}
		}
	}
}

func TestPartition_AgreesWithTheServersPartitionMapping(t *testing.T) {
	for _, n := range []int{2, 3, 4, 7, 16} {
		tr, err := server.NewSubjectTransform("in.*", "p.{{partition("+strconv.Itoa(n)+",1)}}")
		if err != nil {
			t.Fatalf("partition(%d,1) mapping: %v", n, err)
		}
		for i := range 200 {
			tenant := TenantID("tenant-" + strconv.Itoa(i))
			got, err := tr.Match("in." + string(tenant))
			if err != nil {
				t.Fatalf("mapping %q: %v", tenant, err)
			}
			if want := "p." + strconv.Itoa(Partition(tenant, n)); got != want {
				t.Fatalf("tenant %q among %d: the server maps to %q, Partition to %q", tenant, n, got, want)
			}
		}
	}
}

func TestPartition_OneOrFewerPartitionsIsAlwaysZero(t *testing.T) {
	for _, n := range []int{1, 0, -1, -4} {
		for _, tenant := range []TenantID{"a", "acme", "0", ""} {
			if got := Partition(tenant, n); got != 0 {
				t.Errorf("Partition(%q, %d) = %d, want 0", tenant, n, got)
			}
		}
	}
}

func TestPartition_ThousandTenantsTouchEveryOneOfFourPartitions(t *testing.T) {
	counts := make([]int, 4)
	for i := range 1000 {
		p := Partition(TenantID("tenant-"+strconv.Itoa(i)), 4)
		if p < 0 || p >= 4 {
			t.Fatalf("Partition(tenant-%d, 4) = %d, outside [0, 4)", i, p)
		}
		counts[p]++
	}
	for p, n := range counts {
		// A fair hash puts about 250 on each; 150 is far outside chance.
		if n < 150 {
			t.Errorf("partition %d got %d of 1000 tenants (%v)", p, n, counts)
		}
	}
}

func TestSubjects_BuildIngestAndDeadLetterSubjectsUnderThePrefix(t *testing.T) {
	for _, prefix := range []string{"wh", "acme-wh"} {
		s := subjects{prefix: prefix, n: 4}
		for got, want := range map[string]string{
			s.ingest(3, "acme.t"):        prefix + ".ingest.3.acme.t",
			s.ingest(0, "0.events"):      prefix + ".ingest.0.0.events",
			s.deadLetter("acme.t.s"):     prefix + ".dlq.acme.t.s",
			s.partitionFilter(2):         prefix + ".ingest.2.>",
			s.ingestAll():                prefix + ".ingest.>",
			s.deadLetterAll():            prefix + ".dlq.>",
			s.tenantDeadLetters("acme"):  prefix + ".dlq.acme.>",
			s.tenantIngest("acme"):       prefix + ".ingest.3.acme.>", // Partition("acme", 4) == 3
			s.tenantIngest("acme-co"):    prefix + ".ingest.0.acme-co.>",
			s.tenantIngest("tenant-42"):  prefix + ".ingest.2.tenant-42.>",
			s.deadLetter("0.a%2Eb.org"):  prefix + ".dlq.0.a%2Eb.org",
			s.ingest(2147483647, "a.t"):  prefix + ".ingest.2147483647.a.t",
			s.tenantDeadLetters("a_b-c"): prefix + ".dlq.a_b-c.>",
		} {
			if got != want {
				t.Errorf("built %q, want %q", got, want)
			}
		}
	}
}

func TestSubjectsIngestTopic_RoutesTheTopicToItsTenantsPartition(t *testing.T) {
	for _, prefix := range []string{"wh", "acme-wh"} {
		s := subjects{prefix: prefix, n: 4}
		cases := []struct {
			topic   Topic
			subject string
			p       int
		}{
			{Topic{Tenant: "acme-co", Table: "default.clicks", Scope: "org_1"}, prefix + ".ingest.0.acme-co.default%2Eclicks.org_1", 0},
			{Topic{Tenant: "acme", Table: "t"}, prefix + ".ingest.3.acme.t", 3},
			{Topic{Tenant: "tenant-42", Table: "t", Scope: "s"}, prefix + ".ingest.2.tenant-42.t.s", 2},
		}
		for _, c := range cases {
			subject, p, err := s.ingestTopic(c.topic)
			if err != nil || subject != c.subject || p != c.p {
				t.Errorf("ingestTopic(%#v) = %q, %d, %v; want %q, %d", c.topic, subject, p, err, c.subject, c.p)
			}
		}
		if _, _, err := s.ingestTopic(Topic{Tenant: "acme"}); !errors.Is(err, ErrInvalidTopic) {
			t.Errorf("ingestTopic without a table = %v, want ErrInvalidTopic", err)
		}
		if subject, _, err := s.ingestTopic(Topic{Tenant: "Acme", Table: "t"}); !errors.Is(err, ErrInvalidTenant) || subject != "" {
			t.Errorf("ingestTopic with a bad tenant = %q, %v; want ErrInvalidTenant", subject, err)
		}
	}
}

func TestSubjectsIngestTopic_OnePartitionPutsEveryTenantOnPartitionZero(t *testing.T) {
	s := subjects{prefix: "wh", n: 1}
	for _, tenant := range []TenantID{"a", "acme", "0", "tenant-42"} {
		subject, p, err := s.ingestTopic(Topic{Tenant: tenant, Table: "t"})
		if want := "wh.ingest.0." + string(tenant) + ".t"; err != nil || p != 0 || subject != want {
			t.Errorf("ingestTopic(%q) = %q, %d, %v; want %q, 0", tenant, subject, p, err, want)
		}
	}
}

func TestSubjectsKey_ReturnsTheTopicKeyTail(t *testing.T) {
	cases := []struct {
		prefix, subject, key string
	}{
		{"wh", "wh.ingest.3.acme.t", "acme.t"},
		{"wh", "wh.ingest.0.acme.t", "acme.t"},
		{"wh", "wh.ingest.10.acme.t.s", "acme.t.s"},
		{"wh", "wh.ingest.2147483647.a.t", "a.t"},
		{"wh", "wh.dlq.acme.t.s", "acme.t.s"},
		{"wh", "wh.dlq.acme-co.default%2Eclicks.org_1", "acme-co.default%2Eclicks.org_1"},
		{"acme-wh", "acme-wh.ingest.1.a.t", "a.t"},
		{"acme-wh", "acme-wh.dlq.a.t", "a.t"},
		// key strips the routing tokens; it does not judge the tail.
		{"wh", "wh.dlq.A.x", "A.x"},
	}
	for _, c := range cases {
		s := subjects{prefix: c.prefix, n: 4}
		key, ok := s.key(c.subject)
		if !ok || key != c.key {
			t.Errorf("prefix %q: key(%q) = %q, %v; want %q, true", c.prefix, c.subject, key, ok, c.key)
		}
		if got := s.keyOrSubject(c.subject); got != c.key {
			t.Errorf("prefix %q: keyOrSubject(%q) = %q, want %q", c.prefix, c.subject, got, c.key)
		}
	}
}

func TestSubjectsKey_RoundTripsWhatTheBuildersWrite(t *testing.T) {
	s := subjects{prefix: "acme-wh", n: 16}
	for _, table := range subjHardNames {
		topic := Topic{Tenant: "acme", Table: table, Scope: "s"}
		subject, _, err := s.ingestTopic(topic)
		if err != nil {
			t.Fatal(err)
		}
		key, ok := s.key(subject)
		if !ok {
			t.Fatalf("key(%q) refused a subject ingestTopic wrote", subject)
		}
		if back, err := ParseTopicKey(key); err != nil || back != topic {
			t.Errorf("subject %q decodes to %#v, %v; want %#v", subject, back, err, topic)
		}
		want, _ := topic.Key()
		if key, ok := s.key(s.deadLetter(want)); !ok || key != want {
			t.Errorf("dead-letter subject of %q gives key %q, %v", want, key, ok)
		}
	}
}

func TestSubjectsKey_RefusesSubjectsThisPrefixDidNotWrite(t *testing.T) {
	cases := []struct {
		prefix, subject string
	}{
		{"wh", "other.ingest.3.acme.t"},
		{"wh", "acme-wh.ingest.3.acme.t"},
		{"wh", "whx.ingest.3.acme.t"},
		{"wh", "wh"},
		{"wh", "wh."},
		{"wh", ""},
		{"acme-wh", "wh.ingest.3.acme.t"},
		{"acme-wh", "wh.dlq.acme.t"},
		{"wh", "wh.ingest.x.acme.t"},
		{"wh", "wh.ingest.01.acme.t"},
		{"wh", "wh.ingest.00.acme.t"},
		{"wh", "wh.ingest.2147483648.a.t"},
		{"wh", "wh.ingest.99999999999999999999.a.t"},
		{"wh", "wh.ingest.-1.a.t"},
		{"wh", "wh.ingest.+3.a.t"},
		{"wh", "wh.ingest. 3.a.t"},
		{"wh", "wh.ingest.0x1.a.t"},
		{"wh", "wh.ingest..a.t"},
		{"wh", "wh.ingest.3"},
		{"wh", "wh.ingest.3."},
		{"wh", "wh.ingest."},
		{"wh", "wh.ingest"},
		{"wh", "wh.dlq."},
		{"wh", "wh.dlq"},
		{"wh", "wh.other.a.t"},
		{"wh", "wh.hist.a.t"},
		{"wh", "wh.INGEST.3.a.t"},
	}
	for _, c := range cases {
		s := subjects{prefix: c.prefix, n: 4}
		if key, ok := s.key(c.subject); ok {
			t.Errorf("prefix %q: key(%q) = %q, true; want refused", c.prefix, c.subject, key)
		}
		if got := s.keyOrSubject(c.subject); got != c.subject {
			t.Errorf("prefix %q: keyOrSubject(%q) = %q, want the whole subject", c.prefix, c.subject, got)
		}
	}
}

// FuzzTopicKey checks, for any topic Key accepts: the key decodes back to the topic,
// is a valid subject tail, and differs from the keys of related but different topics.
// For any topic Key refuses, the error names the fault.
func FuzzTopicKey(f *testing.F) {
	f.Add("acme-co", "default.clicks", "org_1")
	f.Add("0", "events", "")
	f.Add("0", "a.b", "")
	f.Add("0", "a", "b")
	f.Add("a", "b", "")
	f.Add("b", "a", "")
	f.Add("acme", "", "s")
	f.Add("Acme", "t", "")
	f.Add("", "t", "")
	f.Add(strings.Repeat("a", 64), strings.Repeat("x", 1000), strings.Repeat(".", 300))
	f.Add("t", strings.Repeat("x", 2046), "")
	f.Add("t", strings.Repeat("x", 2047), "")
	for _, name := range subjHardNames {
		f.Add("t", name, "")
		f.Add("t", "x", name)
		f.Add("t", name, name)
	}
	f.Fuzz(func(t *testing.T, tenant, table, scope string) {
		topic := Topic{Tenant: TenantID(tenant), Table: table, Scope: scope}
		key, err := topic.Key()
		if err != nil {
			if !errors.Is(err, ErrInvalidTopic) {
				t.Fatalf("topic %#v: error %v does not wrap ErrInvalidTopic", topic, err)
			}
			switch {
			case TenantID(tenant).Validate() != nil:
				if !errors.Is(err, ErrInvalidTenant) {
					t.Fatalf("topic %#v: tenant fault %v does not wrap ErrInvalidTenant", topic, err)
				}
			case table == "":
				if !strings.Contains(err.Error(), "empty table") {
					t.Fatalf("topic %#v: %v does not name the empty table", topic, err)
				}
			case !strings.Contains(err.Error(), "longer than 2048"):
				t.Fatalf("topic %#v refused for another reason than length: %v", topic, err)
			}
			if key != "" {
				t.Fatalf("topic %#v refused with a key %q", topic, key)
			}
			return
		}
		if len(key) > maxKeyLen {
			t.Fatalf("key of %#v is %d bytes", topic, len(key))
		}
		back, err := ParseTopicKey(key)
		if err != nil {
			t.Fatalf("ParseTopicKey(%q) of %#v: %v", key, topic, err)
		}
		if back != topic {
			t.Fatalf("ParseTopicKey(%q) = %#v, want %#v", key, back, topic)
		}
		if !utf8.ValidString(key) {
			t.Fatalf("key %q is not valid UTF-8", key)
		}
		if why := subjCheckTail(key); why != "" {
			t.Fatalf("key %q of %#v is not a subject tail: %s", key, topic, why)
		}

		// Related topics: the scope moved into the table, table and scope swapped,
		// tenant and table swapped, the table split after its first byte.
		related := []Topic{
			{Tenant: topic.Tenant, Table: table + "." + scope},
			{Tenant: topic.Tenant, Table: scope, Scope: table},
			{Tenant: TenantID(table), Table: tenant, Scope: scope},
		}
		if len(table) > 1 {
			related = append(related, Topic{Tenant: topic.Tenant, Table: table[:1], Scope: table[1:] + scope})
		}
		for _, other := range related {
			otherKey, err := other.Key()
			if err != nil {
				continue
			}
			if other != topic && otherKey == key {
				t.Fatalf("topics %#v and %#v share key %q", topic, other, key)
			}
			if other == topic && otherKey != key {
				t.Fatalf("equal topics %#v give keys %q and %q", topic, key, otherKey)
			}
		}
	})
}

// FuzzParseTopicKey checks that every string ParseTopicKey accepts is the canonical key
// of the topic it decodes to, and that every refusal wraps ErrInvalidTopic.
func FuzzParseTopicKey(f *testing.F) {
	for _, s := range []string{
		"", "a", "0.events", "acme-co.default%2Eclicks.org_1", ".events", "a.b.c.d", "A.x",
		"a.%2", "a.%2G", "a.%2e", "a.%41", "a.x y", "a.", "a.b.", "a.%FF%FE", "a.%25",
		"a.%252E", "a.%00", "a.%2D", "a..b", "t." + strings.Repeat("x", 2046),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		topic, err := ParseTopicKey(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidTopic) {
				t.Fatalf("ParseTopicKey(%q): error %v does not wrap ErrInvalidTopic", s, err)
			}
			if topic != (Topic{}) {
				t.Fatalf("ParseTopicKey(%q) failed but returned %#v", s, topic)
			}
			return
		}
		key, err := topic.Key()
		if err != nil {
			t.Fatalf("ParseTopicKey(%s) succeeded, but its Key fails: %v", subjShort(s), err)
		}
		if key != s {
			t.Fatalf("ParseTopicKey(%s) = %#v, whose Key is %s", subjShort(s), topic, subjShort(key))
		}
	})
}
