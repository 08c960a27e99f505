package walrelay

import (
	"context"

	"github.com/kafkatx/kafkatx/outbox/leading"
	"github.com/kafkatx/kafkatx/pg"
)

// Leading reports, on q's database, whether a WAL relay leads schema's outbox now and whether
// outbox messages may wait for one: leading.WAL, where the rule is written.
func Leading(ctx context.Context, q pg.Querier, schema string) (leader, pending bool, err error) {
	return leading.WAL(ctx, q, schema)
}
