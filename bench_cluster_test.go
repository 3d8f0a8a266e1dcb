//go:build integration

package mq

import (
	"context"
	"testing"
)

// BenchmarkClusterR3: BenchmarkPublish's and BenchmarkPublishBatch's sub-benchmarks
// against an ExternalNATS on a 3-node in-process cluster with the shipped manifests
// at three replicas (each node fsyncs as the shipped values say), raw nats.go as the
// application user on a connection of its own. One cluster serves every
// sub-benchmark, so the partition grows through the run. Needs -tags integration.
func BenchmarkClusterR3(b *testing.B) {
	c := newClusterFixture(b, 3)
	f := &externalFixture{natsFixture: c.natsFixture, shape: c.applyShipped(b, 3)}
	e := f.broker(b)
	if err := e.SetMaxBytes(context.Background(), benchTopic.Tenant, 1<<40); err != nil {
		b.Fatal(err)
	}
	t := newBenchTarget(b, e, e.core, f.connect(b, appUser))
	// raw-fast updates the partition through the operator's handle, as only the
	// operator may; the application user then publishes to it.
	t.admin = f.admin
	open := func(*testing.B) benchTarget { return t }
	b.Run("op=publish", func(b *testing.B) { benchPublish(b, open) })
	b.Run("op=batch", func(b *testing.B) { benchPublishBatch(b, open) })
}
