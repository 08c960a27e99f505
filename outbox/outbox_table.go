package outbox

import (
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// Table is the outbox table's schema-qualified, quoted name in schema ("" is
// pg.DefaultSchema), for a plain-SQL statement of a user's own (docs/outbox-table.md's
// table contract), for example `"kafkatx".outbox`. It is tables.For's name, the one every
// statement of kafkatx uses.
func Table(schema string) string { return tables.For(pg.SchemaOr(schema)).Outbox }
