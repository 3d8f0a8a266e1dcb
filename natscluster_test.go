//go:build integration

package mq

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// clusterFixture is a JetStream cluster of in-process nats-servers, each configured
// from the shipped values like newValuesFixture's server, with its own file store in a
// temp dir, routes and clients on 127.0.0.1 only. Its natsFixture's operator handle
// and client URLs span every node, so a connection moves when its node stops.
type clusterFixture struct {
	*natsFixture
	nodes []*clusterNode
}

// clusterNode is one server of the cluster: the options it restarts from (its client
// and route ports fixed before the first start) and the server while it runs.
type clusterNode struct {
	opts *server.Options
	srv  *server.Server // nil while stopped
}

const testClusterName = "wh-test"

// newClusterFixture starts n nodes and waits until the cluster has a JetStream meta
// leader and takes a replicated stream.
func newClusterFixture(t testing.TB, n int) *clusterFixture {
	t.Helper()
	// Every node lists every other's route at its first start (a JetStream cluster
	// refuses to start without configured routes), so the route ports are taken up
	// front.
	routePorts := make([]int, n)
	for i := range routePorts {
		routePorts[i] = loopbackPort(t)
	}
	c := &clusterFixture{natsFixture: &natsFixture{}}
	for i := range n {
		opts := valuesOptions(t, t.TempDir())
		opts.ServerName = fmt.Sprintf("%s-%d", testClusterName, i)
		opts.Port = loopbackPort(t) // kept for its restarts
		opts.Cluster.Name = testClusterName
		opts.Cluster.Host = "127.0.0.1"
		opts.Cluster.Port = routePorts[i]
		for j, p := range routePorts {
			if j != i {
				opts.Routes = append(opts.Routes, &url.URL{Scheme: "nats-route", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p))})
			}
		}
		c.nodes = append(c.nodes, &clusterNode{opts: opts})
	}
	for i := range c.nodes {
		c.startNode(t, i)
	}
	for _, nd := range c.nodes {
		c.urls = append(c.urls, nd.srv.ClientURL())
	}
	c.awaitHealthy(t)
	c.connectOperator(t)
	c.awaitStreamCreatable(t)
	return c
}

// startNode starts node i from its options, on the ports of its first start.
func (c *clusterFixture) startNode(t testing.TB, i int) {
	t.Helper()
	nd := c.nodes[i]
	nd.srv = runServer(t, nd.opts.Clone())
}

// stopNode shuts node i down cleanly (the server steps down from what it leads
// first), keeping its store.
func (c *clusterFixture) stopNode(t *testing.T, i int) {
	t.Helper()
	nd := c.nodes[i]
	nd.srv.Shutdown()
	nd.srv.WaitForShutdown()
	nd.srv = nil
}

// rollingRestart restarts one node at a time, each once the one before is healthy
// again, as a Kubernetes rollout gated on the chart's healthz probe does. before runs
// ahead of each node's stop.
func (c *clusterFixture) rollingRestart(t *testing.T, before func()) {
	t.Helper()
	for i := range c.nodes {
		before()
		c.stopNode(t, i)
		c.startNode(t, i)
		c.awaitHealthy(t)
	}
}

// fullRestart stops every node, then starts them all again.
func (c *clusterFixture) fullRestart(t *testing.T, before func()) {
	t.Helper()
	before()
	for i := range c.nodes {
		c.stopNode(t, i)
	}
	for i := range c.nodes {
		c.startNode(t, i)
	}
	c.awaitHealthy(t)
}

// awaitHealthy waits until every running node's healthz is ok: JetStream enabled, the
// meta layer and every stream and consumer it holds a replica of current.
func (c *clusterFixture) awaitHealthy(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool {
		leader := false
		for _, nd := range c.nodes {
			if nd.srv == nil {
				continue
			}
			if h := nd.srv.Healthz(&server.HealthzOptions{}); h.StatusCode != 200 {
				return false
			}
			leader = leader || nd.srv.JetStreamIsLeader()
		}
		return leader
	}, 90*time.Second, 50*time.Millisecond, "the cluster never became healthy with a meta leader")
}

// awaitStreamCreatable waits until the cluster takes (and removes) a stream at as many
// replicas as it has nodes: a meta leader alone does not mean the peers are known.
func (c *clusterFixture) awaitStreamCreatable(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err := c.admin.CreateStream(ctx, jetstream.StreamConfig{
			Name: "CLUSTER_PROBE", Subjects: []string{"cluster-probe"}, Replicas: len(c.nodes), Storage: jetstream.FileStorage,
		})
		if err != nil {
			return false
		}
		return c.admin.DeleteStream(ctx, "CLUSTER_PROBE") == nil
	}, 60*time.Second, 100*time.Millisecond, "the cluster never took a replicated stream")
}
