package mq

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Grafana dashboard in deployments/grafana may reference only series the library
// or the NATS exporter emits, under their Prometheus names.

const dashboardPath = "deployments/grafana/mq.json"

// exporterMetrics are series prometheus-nats-exporter v0.20.2 emits without -prefix,
// read from its collector source (collector/jsz.go: "jetstream_" + server, stream,
// consumer series; collector.go: "gnatsd_" + endpoint + the /varz field) and its tests.
var exporterMetrics = []string{
	"gnatsd_varz_connections",
	"gnatsd_varz_slow_consumers",
	"gnatsd_varz_in_msgs",
	"gnatsd_varz_out_msgs",
	"gnatsd_varz_mem",
	"gnatsd_healthz_status",
	"jetstream_server_total_streams",
	"jetstream_server_total_consumers",
	"jetstream_stream_total_messages",
	"jetstream_stream_total_bytes",
	"jetstream_stream_first_seq",
	"jetstream_stream_last_seq",
	"jetstream_stream_source_lag",
	"jetstream_stream_source_active_duration_ns",
	"jetstream_consumer_num_pending",
	"jetstream_consumer_num_ack_pending",
	"jetstream_consumer_num_redelivered",
	"jetstream_consumer_num_waiting",
}

// promUnits are the Prometheus suffixes of the UCUM units the library uses.
var promUnits = map[string]string{"By": "bytes", "s": "seconds", "ms": "milliseconds"}

// promNames are the series an OTel instrument becomes in Prometheus, as the
// OpenTelemetry Prometheus exporters translate it: every character outside
// [a-zA-Z0-9_:] becomes "_"; the unit adds its suffix unless the name ends in it
// (an annotation such as {message} adds none, "1" adds _ratio to a gauge only);
// a counter adds _total, a histogram becomes _bucket, _sum and _count.
func promNames(t *testing.T, i instrumentInfo) []string {
	t.Helper()
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == ':':
			return r
		}
		return '_'
	}, i.name)
	var suffix string
	switch {
	case strings.HasPrefix(i.unit, "{"), i.unit == "":
	case i.unit == "1":
		if i.kind == kindGauge {
			suffix = "ratio"
		}
	default:
		var ok bool
		suffix, ok = promUnits[i.unit]
		require.True(t, ok, "%s: no Prometheus suffix for unit %q", i.name, i.unit)
	}
	if suffix != "" && !strings.HasSuffix(name, "_"+suffix) {
		name += "_" + suffix
	}
	switch i.kind {
	case kindCounter:
		return []string{strings.TrimSuffix(name, "_total") + "_total"}
	case kindHistogram:
		return []string{name + "_bucket", name + "_sum", name + "_count"}
	}
	return []string{name}
}

func TestPromNames_TranslateOTelNamesUnitsAndKinds(t *testing.T) {
	cases := map[instrumentInfo][]string{
		{"messaging.client.sent.messages", kindCounter, "{message}"}:    {"messaging_client_sent_messages_total"},
		{"messaging.process.duration", kindHistogram, "s"}:              {"messaging_process_duration_seconds_bucket", "messaging_process_duration_seconds_sum", "messaging_process_duration_seconds_count"},
		{"mq.tenant.backlog", kindGauge, "By"}:                          {"mq_tenant_backlog_bytes"},
		{"mq.connected", kindGauge, "1"}:                                {"mq_connected_ratio"},
		{"mq.things", kindCounter, "1"}:                                 {"mq_things_total"},
		{"mq.history.source.last_active", kindGauge, "s"}:               {"mq_history_source_last_active_seconds"},
		{"mq.wait_seconds", kindGauge, "s"}:                             {"mq_wait_seconds"},
		{"mq.partition.held_for_history", kindGauge, "{message}"}:       {"mq_partition_held_for_history"},
		{"mq.requests_total", kindCounter, "{request}"}:                 {"mq_requests_total"},
		{"mq.worker-view/x", kindGauge, ""}:                             {"mq_worker_view_x"},
		{"mq.dead_letter.parked", kindCounter, unitOf(metricParked)}:    {"mq_dead_letter_parked_total"},
		{metricWorkerAckPend, kindGauge, unitOf(metricWorkerAckPend)}:   {"mq_worker_ack_pending"},
		{metricTenantBudget, kindGauge, unitOf(metricTenantBudget)}:     {"mq_tenant_budget_bytes"},
		{metricTopologyOK, kindGauge, unitOf(metricTopologyOK)}:         {"mq_topology_ok_ratio"},
		{metricSourceLag, kindGauge, unitOf(metricSourceLag)}:           {"mq_history_source_lag"},
		{metricHeldForHistory, kindGauge, unitOf(metricHeldForHistory)}: {"mq_partition_held_for_history"},
	}
	for in, want := range cases {
		assert.Equal(t, want, promNames(t, in), in.name)
	}
}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promNumbers  = regexp.MustCompile(`\b[0-9][0-9a-zA-Z_.]*`) // numbers and durations
	promIdents   = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
)

// seriesIn are the metric names a PromQL expression selects: string literals, label
// matchers, ranges, grouping labels and numbers are dropped first; a name followed by
// "(" is a function or an aggregation, and the binary keywords are no names.
func seriesIn(expr string) []string {
	for _, re := range []*regexp.Regexp{promStrings, promMatchers, promRanges, promGrouping, promNumbers} {
		expr = re.ReplaceAllString(expr, " ")
	}
	var names []string
	for _, m := range promIdents.FindAllString(expr, -1) {
		if strings.HasSuffix(m, "(") {
			continue
		}
		if m = strings.TrimSpace(m); !slices.Contains(promKeywords, m) && !slices.Contains(names, m) {
			names = append(names, m)
		}
	}
	return names
}

func TestSeriesIn_FindsTheSelectedMetricsAndNothingElse(t *testing.T) {
	cases := map[string][]string{
		`sum by (error_type, mq_partition) (rate(messaging_client_sent_messages_total{error_type!="", x=~"a(b)"}[$__rate_interval]))`: {"messaging_client_sent_messages_total"},
		`histogram_quantile(0.99, sum by (le) (rate(messaging_process_duration_seconds_bucket[5m])))`:                                 {"messaging_process_duration_seconds_bucket"},
		`sum(rate(a_count{error_type!=""}[1m])) / on(job) group_left sum(rate(b_count[1m]))`:                                          {"a_count", "b_count"},
		`min(mq_connected_ratio) and mq_topology_ok_ratio offset 5m`:                                                                  {"mq_connected_ratio", "mq_topology_ok_ratio"},
		`max by (mq_stream) (mq_history_source_lag) > bool 0`:                                                                         {"mq_history_source_lag"},
	}
	for expr, want := range cases {
		assert.Equal(t, want, seriesIn(expr), expr)
	}
}

type grafanaDashboard struct {
	SchemaVersion int `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name, Type, Query string
		} `json:"list"`
	} `json:"templating"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaPanel struct {
	Title      string `json:"title"`
	Type       string `json:"type"`
	Datasource *struct {
		Type, UID string
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

func readDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	var d grafanaDashboard
	require.NoError(t, json.Unmarshal(raw, &d))
	return d
}

// eachPanel calls f on every panel with queries, a collapsed row's included.
func eachPanel(panels []grafanaPanel, f func(grafanaPanel)) {
	for _, p := range panels {
		if p.Type != "row" {
			f(p)
		}
		eachPanel(p.Panels, f)
	}
}

func TestGrafanaDashboard_ReferencesOnlyMetricsTheLibraryOrTheExporterEmits(t *testing.T) {
	d := readDashboard(t)
	library := map[string]string{} // Prometheus series: the instrument's name
	for _, i := range instrumentCatalog {
		for _, n := range promNames(t, i) {
			library[n] = i.name
		}
	}
	used := map[string]bool{}
	queries := 0
	eachPanel(d.Panels, func(p grafanaPanel) {
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		if assert.NotNil(t, p.Datasource, p.Title) {
			assert.Equal(t, "${datasource}", p.Datasource.UID, "panel %q uses the datasource variable", p.Title)
		}
		for _, target := range p.Targets {
			series := seriesIn(target.Expr)
			assert.NotEmpty(t, series, "panel %q: %s selects no metric", p.Title, target.Expr)
			for _, s := range series {
				queries++
				if inst, ok := library[s]; ok {
					used[inst] = true
					continue
				}
				assert.Contains(t, exporterMetrics, s, "panel %q: %s is neither the library's nor the exporter's", p.Title, s)
			}
		}
	})
	assert.Positive(t, queries)
	for _, i := range instrumentCatalog {
		assert.True(t, used[i.name], "no panel shows %s", i.name)
	}
}

func TestGrafanaDashboard_IsSchema39WithAPrometheusDatasourceVariable(t *testing.T) {
	d := readDashboard(t)
	assert.Equal(t, 39, d.SchemaVersion)
	i := slices.IndexFunc(d.Templating.List, func(v struct{ Name, Type, Query string }) bool { return v.Name == "datasource" })
	require.GreaterOrEqual(t, i, 0, "a datasource variable")
	assert.Equal(t, "datasource", d.Templating.List[i].Type)
	assert.Equal(t, "prometheus", d.Templating.List[i].Query)
}

func TestREADME_MetricsTableNamesEveryInstrument(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	require.NoError(t, err)
	readme := string(raw)
	start := strings.Index(readme, "## Metrics")
	require.GreaterOrEqual(t, start, 0)
	section := readme[start:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	for _, i := range instrumentCatalog {
		// The table groups siblings: `mq.worker.pending`, `.ack_pending`, ...
		short := i.name[strings.LastIndex(i.name, "."):]
		assert.True(t, strings.Contains(section, "`"+i.name+"`") || strings.Contains(section, "`"+short+"`"),
			"the README's Metrics section does not name %s", i.name)
	}
}
