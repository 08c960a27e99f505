package pgerr

// The table, code by code, from PostgreSQL 15's Appendix A ("PostgreSQL Error Codes"). A code
// not listed takes its class's row below; a class not listed is Statement. The reasons are
// in docs/failures.md ("The classification, code by code").
//
//	SQLSTATE  name                                   class      why
//	08000     connection_exception                   Server     the connection, not the statement
//	08001     sqlclient_unable_to_establish_sqlconnection Server no connection could be made
//	08003     connection_does_not_exist              Server     the connection is gone
//	08004     sqlserver_rejected_establishment_of_sqlconnection Server the server refused the session
//	08006     connection_failure                     Server     the connection broke
//	08007     transaction_resolution_unknown         Server     the outcome is unknown: settle it from the database's record
//	08P01     protocol_violation                     Statement  an oversized or malformed message is the statement's (a bind of >1 GB)
//	25006     read_only_sql_transaction              Server     a read-only server (an old primary after a switchover, a standby)
//	25P02     in_failed_sql_transaction              Statement  an earlier statement of the transaction failed (listed so logs name it)
//	25P03     idle_in_transaction_session_timeout    Server     the session was ended; a new one is needed
//	28000     invalid_authorization_specification    Server     the login was refused: configuration, no message's doing
//	28P01     invalid_password                       Server     the login was refused: configuration, no message's doing
//	3D000     invalid_catalog_name                   Server     at connect: the database does not exist (yet); no message names it
//	40001     serialization_failure                  Conflict   lost a race with a concurrent transaction: run it again
//	40P01     deadlock_detected                      Conflict   lost a race with a concurrent transaction: run it again
//	40002     transaction_integrity_constraint_violation Statement a deferred constraint failed at COMMIT (listed so logs name it)
//	40003     statement_completion_unknown           Server     the outcome is unknown: settle it from the database's record
//	53000     insufficient_resources                 Server     the server's resources
//	53100     disk_full                              Server     the server's disk
//	53200     out_of_memory                          Statement  one statement that locks too many relations (max_locks_per_transaction) or builds a huge result
//	53300     too_many_connections                   Server     the server's connection slots
//	53400     configuration_limit_exceeded           Statement  one query's temp_file_limit
//	55P03     lock_not_available                     Conflict   lock_timeout passed behind another transaction's lock
//	57000     operator_intervention                  Server     an operator's act, not the statement's
//	57014     query_canceled                         Statement  statement_timeout: the statement ran too long (pg_cancel_backend also answers it)
//	57P01     admin_shutdown                         Server     the server is shutting down or ended the session (pg_terminate_backend)
//	57P02     crash_shutdown                         Server     another backend crashed and the server restarts
//	57P03     cannot_connect_now                     Server     the server is starting or in recovery
//	57P04     database_dropped                       Statement  nothing to wait for: the database is gone (the breaker stops the storm)
//	57P05     idle_session_timeout                   Server     the session was ended; a new one is needed
//	58000     system_error                           Server     an operating-system error outside PostgreSQL
//	58030     io_error                               Server     the server's storage
//	58P01     undefined_file                         Statement  a file a statement names (COPY FROM, pg_read_file) is missing
//	58P02     duplicate_file                         Statement  a file a statement creates exists
//	72000     snapshot_too_old                       Conflict   old_snapshot_threshold passed: a new snapshot succeeds
//	F0000     config_file_error                      Server     the server's configuration
//	F0001     lock_file_exists                       Server     the server's data directory
//	XX000     internal_error                         Statement  an elog(ERROR) a particular statement can trigger ("cache lookup failed")
//	XX001     data_corrupted                         Server     corruption is the server's, not the message's
//	XX002     index_corrupted                        Server     corruption is the server's, not the message's
//
// Every other class — 22 data exception, 23 integrity constraint violation, 42 syntax error or
// access rule violation (42501 insufficient_privilege included: a statement can name a table
// it may not write; a privilege revoked from everyone is the breaker's), P0 PL/pgSQL, 0A, 54
// program limit, 2B, 2D, 38, 39, 44, HV... — is the statement's.

type entry struct {
	class Class
	name  string
}

// codes holds the SQLSTATEs whose class differs from their class row's, or that readiness
// and logs name.
var codes = map[string]entry{
	"08000": {Server, "connection_exception"},
	"08001": {Server, "sqlclient_unable_to_establish_sqlconnection"},
	"08003": {Server, "connection_does_not_exist"},
	"08004": {Server, "sqlserver_rejected_establishment_of_sqlconnection"},
	"08006": {Server, "connection_failure"},
	"08007": {Server, "transaction_resolution_unknown"},
	"08P01": {Statement, "protocol_violation"},

	"25006": {Server, "read_only_sql_transaction"},
	"25P02": {Statement, "in_failed_sql_transaction"},
	"25P03": {Server, "idle_in_transaction_session_timeout"},

	"28000": {Server, "invalid_authorization_specification"},
	"28P01": {Server, "invalid_password"},

	"3D000": {Server, "invalid_catalog_name"},

	"40001": {Conflict, "serialization_failure"},
	"40002": {Statement, "transaction_integrity_constraint_violation"},
	"40003": {Server, "statement_completion_unknown"},
	"40P01": {Conflict, "deadlock_detected"},

	"53000": {Server, "insufficient_resources"},
	"53100": {Server, "disk_full"},
	"53200": {Statement, "out_of_memory"},
	"53300": {Server, "too_many_connections"},
	"53400": {Statement, "configuration_limit_exceeded"},

	"55P03": {Conflict, "lock_not_available"},

	"57000": {Server, "operator_intervention"},
	"57014": {Statement, "query_canceled"},
	"57P01": {Server, "admin_shutdown"},
	"57P02": {Server, "crash_shutdown"},
	"57P03": {Server, "cannot_connect_now"},
	"57P04": {Statement, "database_dropped"},
	"57P05": {Server, "idle_session_timeout"},

	"58000": {Server, "system_error"},
	"58030": {Server, "io_error"},
	"58P01": {Statement, "undefined_file"},
	"58P02": {Statement, "duplicate_file"},

	"72000": {Conflict, "snapshot_too_old"},

	"F0000": {Server, "config_file_error"},
	"F0001": {Server, "lock_file_exists"},

	"XX000": {Statement, "internal_error"},
	"XX001": {Server, "data_corrupted"},
	"XX002": {Server, "index_corrupted"},
}

// classes holds the class rows: a code of class 08 not listed above is a connection exception
// (Server), of class 53 an insufficient resource (Server), of class 58 a system error
// (Server), of class XX an internal error (Statement).
var classes = map[string]entry{
	"08": {Server, "connection_exception"},
	"53": {Server, "insufficient_resources"},
	"58": {Server, "system_error"},
	"XX": {Statement, "internal_error"},
}

// Listed returns the SQLSTATEs the table above names code by code, and the classes it names
// by row (two characters, "08": a code of that class not listed), each with its Class: what
// docs/failures.md's table must show. A class in neither is Statement.
func Listed() (byCode, byClassRow map[string]Class) {
	byCode, byClassRow = make(map[string]Class, len(codes)), make(map[string]Class, len(classes))
	for c, e := range codes {
		byCode[c] = e.class
	}
	for c, e := range classes {
		byClassRow[c] = e.class
	}
	return byCode, byClassRow
}
