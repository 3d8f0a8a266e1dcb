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
	// The shipped partitions deny purges; here the operator allows them, so that the
	// benchmark can empty a partition between its sub-benchmarks (see open).
	allowPurge := func(s *shape) {
		for p := range s.topo.Partitions {
			cfg := s.stream(b, s.topo.PartitionStream(p))
			cfg.DenyPurge = false
		}
	}
	f := &externalFixture{natsFixture: c.natsFixture, shape: c.applyShipped(b, 3, allowPurge)}
	e := f.broker(b)
	if err := e.SetMaxBytes(context.Background(), benchTopic.Tenant, 1<<40); err != nil {
		b.Fatal(err)
	}
	t := newBenchTarget(b, e, e.core, f.connect(b, appUser))
	// raw-fast updates the partition through the operator's handle, as only the
	// operator may; the application user then publishes to it.
	t.admin = f.admin
	// Nothing consumes what the sub-benchmarks publish, and one partition takes it
	// all: make bench's six runs reached its per-subject limit (MaxMsgsPerSubject; the
	// batch rows failed from the third run on), so each sub-benchmark starts from an
	// empty partition, purged by the operator.
	open := func(b *testing.B) benchTarget {
		s, err := f.admin.Stream(context.Background(), t.stream)
		if err == nil {
			err = s.Purge(context.Background())
		}
		if err != nil {
			b.Fatal(err)
		}
		return t
	}
	b.Run("op=publish", func(b *testing.B) { benchPublish(b, open) })
	b.Run("op=batch", func(b *testing.B) { benchPublishBatch(b, open) })
}
