package airflow

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// DefaultRunIDPrefix starts every run id derived by RunID when Config.RunIDPrefix is empty.
const DefaultRunIDPrefix = "kafkatx__"

// MaxRunIDLength is the longest run id Airflow stores (its dag_run.run_id column, ID_LEN).
const MaxRunIDLength = 250

// RunID derives a DAG run id from an idempotency key, deterministically, so that every retry,
// redelivery or restart for one key posts the same dag_run_id and Airflow answers 409 after
// the first. A key made only of the characters Airflow's default allowed_run_id_pattern
// accepts (^[A-Za-z0-9_.:+-]+$, '~' excluded here) is kept readable: prefix + key, as long as
// it fits in MaxRunIDLength. Any other key becomes prefix + "~" + the SHA-256 of the key in
// hex, so two different keys never share a run id (the '~' cannot appear in the readable
// form). An empty prefix means DefaultRunIDPrefix.
func RunID(prefix, key string) string {
	if prefix == "" {
		prefix = DefaultRunIDPrefix
	}
	if key != "" && len(prefix)+len(key) <= MaxRunIDLength && readable(key) {
		return prefix + key
	}
	sum := sha256.Sum256([]byte(key))
	return prefix + "~" + hex.EncodeToString(sum[:])
}

func readable(key string) bool {
	return strings.IndexFunc(key, func(r rune) bool {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return false
		case r == '_', r == '.', r == ':', r == '+', r == '-':
			return false
		}
		return true
	}) < 0
}
