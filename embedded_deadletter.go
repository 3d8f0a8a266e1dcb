package mq

import (
	"context"
	"fmt"
)

// EmbeddedNATS's dead letters: parking, counting, reading, redriving and removing them.

// DeadLetter parks msg on the dead-letter stream under its own topic.
func (e *EmbeddedNATS) DeadLetter(ctx context.Context, msg *Message, opts ...PublishOpt) error {
	if err := e.opened(); err != nil {
		return err
	}
	return e.core.deadLetter(ctx, msg, opts, "")
}

// DeadLetterCounts counts tenant's parked events; a tenant never given a budget has no
// queue and is ErrNoDeadLetterQueue, unless a host parked events of it (DeadLetter
// takes a message of any tenant): those are counted.
func (e *EmbeddedNATS) DeadLetterCounts(ctx context.Context, tenant TenantID, table string) (DeadLetterCounts, error) {
	if err := e.opened(); err != nil {
		return DeadLetterCounts{}, err
	}
	if ctx == nil {
		return DeadLetterCounts{}, errNilContext("dead-letter counts")
	}
	if err := e.core.checkOpen(); err != nil {
		return DeadLetterCounts{}, err
	}
	if err := tenant.Validate(); err != nil {
		return DeadLetterCounts{}, fmt.Errorf("dead-letter counts: %w", err)
	}
	counts, err := e.core.deadLetterCounts(ctx, tenant, table)
	if _, ok := e.budgets.limit(tenant); !ok && err == nil && counts.Total == 0 {
		return DeadLetterCounts{}, fmt.Errorf("dead-letter counts: tenant %s was never given a budget: %w", tenant, ErrNoDeadLetterQueue)
	}
	return counts, err
}

// DeadLetters pages tenant's parked events, oldest first; see [DeadLetterManager].
func (e *EmbeddedNATS) DeadLetters(ctx context.Context, tenant TenantID, q DeadLetterQuery) ([]*Message, string, error) {
	if err := e.opened(); err != nil {
		return nil, "", err
	}
	return e.core.listDeadLetters(ctx, tenant, q)
}

// Redrive publishes the selected parked events again through Publish and removes each
// once stored; see [DeadLetterManager].
func (e *EmbeddedNATS) Redrive(ctx context.Context, tenant TenantID, sel DeadLetterSelector) (int, error) {
	if err := e.opened(); err != nil {
		return 0, err
	}
	return e.core.redrive(ctx, tenant, sel, e.Publish)
}

// DeleteDeadLetters removes the selected parked events; see [DeadLetterManager].
func (e *EmbeddedNATS) DeleteDeadLetters(ctx context.Context, tenant TenantID, sel DeadLetterSelector) (int, error) {
	if err := e.opened(); err != nil {
		return 0, err
	}
	return e.core.deleteDeadLetters(ctx, tenant, sel)
}
