//go:build integration

package mq

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// Test-only shims for the conformance run against ExternalNATS in package mq_test.

// ExternalFixture is an in-process server configured from the shipped Helm values,
// with the shipped manifests applied by the operator user.
type ExternalFixture struct{ f *externalFixture }

// NewExternalFixture starts the server and applies the shipped manifests.
func NewExternalFixture(t *testing.T) *ExternalFixture {
	return &ExternalFixture{f: newExternalFixture(t)}
}

// Broker boots an ExternalNATS as the restricted application user.
func (x *ExternalFixture) Broker(t *testing.T) *ExternalNATS { return x.f.broker(t) }

// RestartServer shuts the server down and starts it again on the same port and store.
func (x *ExternalFixture) RestartServer(t *testing.T) {
	x.f.stop(t)
	x.f.restart(t)
}

// DeleteIngestDurables deletes the ingest durable on every partition, as the operator.
func (x *ExternalFixture) DeleteIngestDurables(t *testing.T) {
	x.f.deleteIngestDurables(t, shippedTopology)
}

// ShrinkPartitionOf sets the max_bytes of tenant's partition, as the operator.
func (x *ExternalFixture) ShrinkPartitionOf(t *testing.T, tenant TenantID, maxBytes int64) {
	topo := shippedTopology.WithDefaults()
	x.f.updateStream(t, topo.PartitionStream(Partition(tenant, topo.Partitions)),
		func(cfg *jetstream.StreamConfig) { cfg.MaxBytes = maxBytes })
}
