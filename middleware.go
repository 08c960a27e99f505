package kafkatx

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Middleware wraps the batch handler, as Watermill's HandlerMiddleware wraps its handler:
// it returns a BatchHandler that does its own work around a call of next. Config.Middleware
// applies a list of them to every handler, the per-message Handler included (NewConsumer
// adapts it to a BatchHandler first, so a middleware sees the messages of one transaction at
// once).
//
// A middleware runs inside the batch's transaction and follows the handler's rules: what it
// returns is treated as the handler's answer — nil commits, Permanent(err) or
// FailMessage(m, Permanent(err)) dead-letters, any other error is retried with backoff and
// counts an attempt, Unavailable(err) waits without one — and a panic in it is recovered and
// counted as an attempt with its stack, like a panic in the handler. Its tx refuses Commit and
// Rollback as the handler's does (ErrTxOwnedByLoop). A middleware that panics while wrapping
// next, or returns nil, makes NewConsumer return an error. It may be called again
// for the same messages when kafkatx re-runs a batch to isolate a failing message, so it
// must not keep state across calls that assumes one call per message.
type Middleware func(next BatchHandler) BatchHandler

// Chain returns h wrapped in mws as a Consumer wraps its handler with Config.Middleware:
// mws[0] is the outermost (it runs first and sees what every later middleware and the handler
// returned); nil entries are skipped. A middleware that panics while it wraps its next handler,
// or returns a nil BatchHandler, is an error of the configuration (NewConsumer returns it),
// not a panic of NewConsumer or of every handler call. Package kafkatxtest uses it to run a
// handler with the middleware the loop would apply.
func Chain(h BatchHandler, mws ...Middleware) (out BatchHandler, err error) {
	i := len(mws) - 1
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("kafkatx: Config.Middleware[%d] panicked wrapping its next handler: %v", i, r)
		}
	}()
	for ; i >= 0; i-- {
		if mws[i] != nil {
			if h = mws[i](h); h == nil {
				return nil, fmt.Errorf("kafkatx: Config.Middleware[%d] returned a nil BatchHandler", i)
			}
		}
	}
	return h, nil
}

// withGroup passes group to h and its middleware in the context (GroupFromContext).
func withGroup(h BatchHandler, group string) BatchHandler {
	return func(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
		return h(context.WithValue(ctx, groupKey{}, group), tx, msgs)
	}
}

// groupKey is the context key of the consumer group passed to handlers.
type groupKey struct{}

// GroupFromContext returns the consumer group (Kafka's group.id) of the Consumer that called
// the handler or middleware with ctx, and false outside a Consumer's handler call — for
// middleware that labels its work by group (package kafkatxotel sets the semantic-convention
// attribute messaging.consumer.group.name from it), in the manner of River's
// ClientFromContext.
func GroupFromContext(ctx context.Context) (string, bool) {
	g, ok := ctx.Value(groupKey{}).(string)
	return g, ok
}
