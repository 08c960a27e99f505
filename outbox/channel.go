package outbox

import (
	"crypto/md5"
	"encoding/hex"
)

// Channel returns the PostgreSQL NOTIFY channel on which an insert into schema's outbox wakes
// the relay (the table's outbox_channel function): "<schema>.outbox", or, for schema names
// longer than 56 bytes, "kafkatx.outbox." and the first 16 hex digits of md5(schema), within
// PostgreSQL's 63-byte identifier limit. LISTEN needs it quoted (pgx.Identifier).
func Channel(schema string) string {
	if len(schema) <= 56 {
		return schema + ".outbox"
	}
	sum := md5.Sum([]byte(schema))
	return "kafkatx.outbox." + hex.EncodeToString(sum[:])[:16]
}
