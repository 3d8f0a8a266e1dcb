package mq

import "strconv"

// Stream metadata that `nats server check stream` (natscli) reads as its thresholds, so
// an operator's monitoring alerts on the history falling behind without flags of its
// own. The keys are jsm.go's (package jsm, MonitorEnabled and StreamMonitorMeta*: the
// stream health check natscli runs, whose help names io.nats.monitor.lag-critical).
const (
	monitorEnabled      = "io.nats.monitor.enabled"
	monitorLagCritical  = "io.nats.monitor.lag-critical"
	monitorSeenCritical = "io.nats.monitor.seen-critical"
	monitorMinSources   = "io.nats.monitor.min-sources"
	monitorMaxSources   = "io.nats.monitor.max-sources"
)

// Starting points for the history's alerts: a source more than historyLagCritical
// events behind, or silent for historySeenCritical, holds acknowledged events on its
// partition and leaves the hub and replay behind.
const (
	historyLagCritical  = 10_000
	historySeenCritical = "1m"
)

// historyMonitorMetadata is the history's monitoring metadata: exactly one source per
// partition, none lagging or silent past the thresholds.
func (t NATSTopology) historyMonitorMetadata() map[string]string {
	n := strconv.Itoa(t.Partitions)
	return map[string]string{
		monitorEnabled:      "true",
		monitorLagCritical:  strconv.Itoa(historyLagCritical),
		monitorSeenCritical: historySeenCritical,
		monitorMinSources:   n,
		monitorMaxSources:   n,
	}
}

// checkHistoryMonitor advises on monitoring metadata that would make the server check
// alert on a healthy history. Metadata left out, or other thresholds, are the
// operator's to choose.
func (v *verifier) checkHistoryMonitor(obj string, meta map[string]string) {
	for _, key := range []string{monitorMinSources, monitorMaxSources} {
		if got, ok := meta[key]; ok && got != strconv.Itoa(v.topo.Partitions) {
			v.add(Recommended, obj, "metadata", "%s is %s, the topology has %d partitions: `nats server check stream` would alert on a healthy history",
				key, got, v.topo.Partitions)
		}
	}
}
