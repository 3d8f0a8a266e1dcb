package mq

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unopenedBrokers are the brokers no constructor made: nil pointers and zero values.
func unopenedBrokers() map[string]any {
	return map[string]any{
		"nil *EmbeddedNATS": (*EmbeddedNATS)(nil),
		"zero EmbeddedNATS": &EmbeddedNATS{},
		"nil *ExternalNATS": (*ExternalNATS)(nil),
		"zero ExternalNATS": &ExternalNATS{},
	}
}

// Every exported method, found by reflection so a method added later is covered too,
// is called with a live ctx and zero values for the rest.
func TestUnopenedBroker_EveryMethodReturnsErrClosedInsteadOfPanicking(t *testing.T) {
	ctxType := reflect.TypeFor[context.Context]()
	errType := reflect.TypeFor[error]()
	for name, b := range unopenedBrokers() {
		v := reflect.ValueOf(b)
		methods := 0
		for i := range v.NumMethod() {
			m, mt := v.Method(i), v.Type().Method(i)
			methods++
			t.Run(name+"/"+mt.Name, func(t *testing.T) {
				args := make([]reflect.Value, 0, m.Type().NumIn())
				for j := range m.Type().NumIn() {
					in := m.Type().In(j)
					switch {
					case m.Type().IsVariadic() && j == m.Type().NumIn()-1:
					case in == ctxType:
						args = append(args, reflect.ValueOf(context.Background()))
					default:
						args = append(args, reflect.Zero(in))
					}
				}
				var out []reflect.Value
				require.NotPanics(t, func() { out = m.Call(args) })
				last := out[len(out)-1]
				if last.Type() != errType {
					for _, o := range out {
						assert.True(t, o.IsZero(), "%s returned %v on a broker never opened", mt.Name, o)
					}
					return
				}
				err, _ := last.Interface().(error)
				if mt.Name == "Close" {
					assert.NoError(t, err, "closing a broker never opened has nothing to do")
					return
				}
				require.ErrorIs(t, err, ErrClosed)
				assert.Contains(t, err.Error(), "never opened")
			})
		}
		require.Greater(t, methods, 15, "%s: the reflection found the broker's methods", name)
	}
}

// A health probe wired to a broker whose constructor failed answers 503, not a crash of
// the server's handler goroutine.
func TestHealthHandler_OnABrokerNeverOpenedAnswers503(t *testing.T) {
	for name, b := range unopenedBrokers() {
		rec := httptest.NewRecorder()
		HealthHandler(b.(HealthChecker)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code, name)
		assert.True(t, strings.Contains(rec.Body.String(), "never opened"), "%s: %q", name, rec.Body.String())
	}
}

// The Broker interface is what a host holds: its methods are the ones covered above.
func TestUnopenedBroker_IsStillABroker(t *testing.T) {
	var b Broker = (*EmbeddedNATS)(nil)
	err := b.Publish(context.Background(), Topic{Tenant: "acme", Table: "t"}, []byte("x"))
	require.True(t, errors.Is(err, ErrClosed), "Publish: %v", err)
	b = &ExternalNATS{}
	_, err = b.CreateConsumer(context.Background(), ConsumerConfig{})
	require.ErrorIs(t, err, ErrClosed)
}
