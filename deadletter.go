package mq

// deadLetterTables folds per-subject dead-letter counts into per-table counts, the
// shape of DeadLetterCounts.Tables. Every scope of a table counts under the table
// itself, so a table literally named "a.b" (one escaped token) never shares a count
// with table "a" scope "b". A non-empty table keeps only that table, with all its
// scopes. A subject this prefix did not write counts under its whole topic-key tail.
func deadLetterTables(perSubject map[string]uint64, subs subjects, table string) map[string]uint64 {
	tables := make(map[string]uint64)
	for subject, n := range perSubject {
		name := subs.keyOrSubject(subject)
		if t, err := ParseTopicKey(name); err == nil {
			name = t.Table
		}
		if table != "" && name != table {
			continue
		}
		tables[name] += n
	}
	return tables
}
