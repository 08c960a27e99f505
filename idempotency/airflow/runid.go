package airflow

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// DefaultRunIDPrefix starts every run id derived by RunID when Config.RunIDPrefix is empty.
const DefaultRunIDPrefix = "kafkatx__"

// MaxRunIDLength is the longest run id Airflow stores (its dag_run.run_id column, ID_LEN);
// Airflow 3 answers 422 to a longer one.
const MaxRunIDLength = 250

// hashedLen is the length of the hashed form's tail: "~" and 64 hex digits.
const hashedLen = 1 + 2*sha256.Size

// MaxRunIDPrefixLength is the longest prefix that leaves room for the hashed form.
const MaxRunIDPrefixLength = MaxRunIDLength - hashedLen

// reservedRunIDPrefixes start the run ids of Airflow's other run types (DagRunType in
// airflow/utils/types.py: backfill, scheduled, operator_triggered, asset_triggered,
// asset_materialization). Airflow 3 answers 400 to a manual run whose id starts with one.
var reservedRunIDPrefixes = []string{"backfill__", "scheduled__", "operator_triggered__", "asset_triggered__", "asset_materialization__"}

// RunID derives a DAG run id from an idempotency key, deterministically, so that every retry,
// redelivery or restart for one key posts the same dag_run_id and Airflow answers 409 after
// the first.
//
// The id is one Airflow 3 accepts for a manual run (it checks them in DagRun.validate_run_id
// and the DAG's create_dagrun): characters of its default allowed_run_id_pattern
// (^[A-Za-z0-9_.~:+-]+$), no "..", no prefix of another run type ("scheduled__" and the
// like), at most MaxRunIDLength characters. A key made only of [A-Za-z0-9_.:+-] whose
// readable id, prefix + key, breaks none of these rules is kept readable: prefix + key. Any
// other key becomes prefix + "~" + the SHA-256 of the key in hex, so two different keys never
// share a run id (a readable key never starts with '~'). This keeps every id that Airflow
// accepted from earlier versions of RunID exactly as it was (a redelivered event still gets
// its 409); only ids Airflow refused — a key with "..", such as a Debezium source without a
// schema name (app..customers) — are now hashed.
//
// An empty prefix means DefaultRunIDPrefix. The prefix must pass ValidateRunIDPrefix (New
// checks Config.RunIDPrefix); RunID replaces a prefix that does not by DefaultRunIDPrefix, so
// it never returns an id Airflow refuses.
func RunID(prefix, key string) string {
	if prefix == "" || ValidateRunIDPrefix(prefix) != nil {
		prefix = DefaultRunIDPrefix
	}
	if id := prefix + key; key != "" && len(id) <= MaxRunIDLength && readable(key) && accepted(id) {
		return id
	}
	sum := sha256.Sum256([]byte(key))
	return prefix + "~" + hex.EncodeToString(sum[:])
}

// ValidateRunIDPrefix reports why prefix cannot start run ids: empty, longer than
// MaxRunIDPrefixLength, characters outside Airflow's allowed_run_id_pattern, "..", or the
// prefix of another run type (see RunID). The error says which.
func ValidateRunIDPrefix(prefix string) error {
	switch {
	case prefix == "":
		return errors.New("airflow: run id prefix is empty")
	case len(prefix) > MaxRunIDPrefixLength:
		return fmt.Errorf("airflow: run id prefix is %d bytes; at most %d leave room for a hashed key", len(prefix), MaxRunIDPrefixLength)
	case !allowed(prefix, true):
		return fmt.Errorf("airflow: run id prefix %q has a character outside Airflow's run id pattern ^[A-Za-z0-9_.~:+-]+$", prefix)
	case !accepted(prefix):
		return fmt.Errorf("airflow: run id prefix %q contains '..' or starts like another run type's ids (%s): Airflow refuses such ids",
			prefix, strings.Join(reservedRunIDPrefixes, ", "))
	}
	return nil
}

// accepted reports whether Airflow's rules beyond the character set let id through.
func accepted(id string) bool {
	if strings.Contains(id, "..") {
		return false
	}
	for _, p := range reservedRunIDPrefixes {
		if strings.HasPrefix(id, p) {
			return false
		}
	}
	return true
}

func readable(key string) bool { return allowed(key, false) }

// allowed reports whether s is made of [A-Za-z0-9_.:+-], and '~' when tilde is set.
func allowed(s string, tilde bool) bool {
	return strings.IndexFunc(s, func(r rune) bool {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return false
		case r == '_', r == '.', r == ':', r == '+', r == '-':
			return false
		case r == '~':
			return !tilde
		}
		return true
	}) < 0
}
