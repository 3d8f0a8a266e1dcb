package mq

import "testing"

func TestEventID_GivesTheCallersKeyBackAndKeepsTheBrokersOwn(t *testing.T) {
	for _, c := range []struct {
		tenant TenantID
		msgID  string
		want   string
	}{
		{"acme", scopedID("acme", "row-1"), "row-1"},
		{"acme", scopedID("acme", "a.b"), "a.b"},
		{"acme", scopedID("acme", "acme.x"), "acme.x"},
		{"acme", "Jd8vMyS0uNNoxu8UwzmFzc", "Jd8vMyS0uNNoxu8UwzmFzc"},
		{"acme", scopedID("globex", "row-1"), "globex.row-1"},
		{"", ".x", ".x"},
	} {
		if got := eventID(c.tenant, c.msgID); got != c.want {
			t.Errorf("eventID(%q, %q) = %q, want %q", c.tenant, c.msgID, got, c.want)
		}
	}
}
