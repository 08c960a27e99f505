package pg

import "github.com/kafkatx/kafkatx/internal/pgerr"

// LostRace reports whether err is PostgreSQL's answer to a transaction that lost a race with
// a concurrent one — a serialization failure, a deadlock, a lock timeout, ... (the Conflict
// class of kafkatx's one database-error classifier, docs/failures.md): running the same
// transaction again is the remedy.
func LostRace(err error) bool { return pgerr.Classify(err) == pgerr.Conflict }
