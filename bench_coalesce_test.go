package mq

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// BenchmarkPublishCoalesced is an experiment in raw nats.go, before any library code:
// 32 callers of one tenant, each waiting for its own confirmation, either each with
// a synchronous publish (impl=raw-sync) or through one sender that gathers whatever
// callers wait while its previous send is in flight into one atomic batch
// (impl=raw-coalesced), as a database's group commit does. If the second is not well
// ahead, coalescing is not worth its all-or-nothing coupling of unrelated callers.
func BenchmarkPublishCoalesced(b *testing.B) {
	payload := make([]byte, benchPayload)
	for _, mode := range syncModes {
		b.Run("sync="+mode.name, func(b *testing.B) {
			b.Run("impl=raw-sync", func(b *testing.B) {
				t := embeddedTarget(mode.noSync)(b)
				benchCallers(b, 32, func() error {
					_, err := t.raw.Publish(context.Background(), t.subject, payload,
						jetstream.WithMsgID(nuid.Next()), jetstream.WithExpectStream(t.stream))
					return err
				})
			})
			b.Run("impl=raw-coalesced", func(b *testing.B) {
				t := embeddedTarget(mode.noSync)(b)
				type req struct {
					msg  *nats.Msg
					done chan error
				}
				reqs := make(chan req, 64)
				stop := make(chan struct{})
				defer close(stop)
				go func() {
					for {
						var batch []req
						select {
						case r := <-reqs:
							batch = append(batch, r)
						case <-stop:
							return
						}
					gather:
						for len(batch) < 256 {
							select {
							case r := <-reqs:
								batch = append(batch, r)
							default:
								break gather
							}
						}
						var err error
						if len(batch) == 1 {
							_, err = t.raw.PublishMsg(context.Background(), batch[0].msg)
						} else {
							msgs := make([]*nats.Msg, len(batch))
							for i, r := range batch {
								msgs[i] = r.msg
							}
							_, err = jetstreamext.PublishMsgBatch(context.Background(), t.raw, msgs,
								jetstreamext.BatchFlowControl{AckFirst: true})
						}
						for _, r := range batch {
							r.done <- err
						}
					}
				}()
				benchCallers(b, 32, func() error {
					h := nats.Header{}
					h.Set(jetstream.MsgIDHeader, nuid.Next())
					h.Set(jetstream.ExpectedStreamHeader, t.stream)
					r := req{msg: &nats.Msg{Subject: t.subject, Data: payload, Header: h}, done: make(chan error, 1)}
					reqs <- r
					return <-r.done
				})
			})
		})
	}
}
