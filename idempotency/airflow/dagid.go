package airflow

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxDAGIDLength is the longest DAG id Airflow stores (ID_LEN, 250 characters).
const MaxDAGIDLength = 250

// ValidateDAGID reports why id cannot name a DAG, before any request: empty, longer than
// MaxDAGIDLength characters, a character outside Airflow's key pattern (KEY_REGEX
// ^[\w.-]+$: letters, digits, "_", "." and "-"), or dots only. The id is a segment of the
// request's URL (/api/v2/dags/{dag_id}/dagRuns): a "/" or a ".." segment would be resolved and
// the request sent to another endpoint of the API (found by a fresh-eyes attack:
// --dag-id 'ü/../x' was accepted).
func ValidateDAGID(id string) error {
	switch {
	case id == "":
		return errors.New("airflow: the DAG id is empty")
	case !utf8.ValidString(id):
		return errors.New("airflow: the DAG id is not valid UTF-8")
	case utf8.RuneCountInString(id) > MaxDAGIDLength:
		return fmt.Errorf("airflow: the DAG id is %d characters; Airflow takes at most %d", utf8.RuneCountInString(id), MaxDAGIDLength)
	case strings.Trim(id, ".") == "":
		return fmt.Errorf("airflow: the DAG id %q is only dots: a path segment, not a name", id)
	}
	for _, r := range id {
		if r != '_' && r != '.' && r != '-' && !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			return fmt.Errorf("airflow: the DAG id %q has %q, outside Airflow's DAG id pattern ^[\\w.-]+$ (letters, digits, _ . -)", id, r)
		}
	}
	return nil
}

// validRunIDSegment reports why a run id given by the caller (Trigger.RunID) cannot be a
// segment of the run's URL: a "/", or dots only. Derived run ids (RunID) never are.
func validRunIDSegment(id string) error {
	if strings.Contains(id, "/") || strings.Trim(id, ".") == "" {
		return fmt.Errorf("airflow: run id %q cannot name a run in a URL (a \"/\" or dots only)", id)
	}
	return nil
}
