package console

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
)

// A secret is blanked in every form it travels in: a dead letter that quotes a DSN holds the
// password escaped as userinfo, which neither QueryEscape nor PathEscape produces.
func TestSecretIsBlankedInEveryEncoding(t *testing.T) {
	const secret = "p@ss w/rd:Z9"
	r := secretPairs([]string{secret})
	for _, form := range []string{
		secret,
		url.QueryEscape(secret),
		url.PathEscape(secret),
		strings.TrimPrefix(url.UserPassword("", secret).String(), ":"),
		base64.StdEncoding.EncodeToString([]byte(secret)),
	} {
		got := r.Replace("postgres://ops:" + form + "@db:5432/x")
		if strings.Contains(got, form) || got != "postgres://ops:***@db:5432/x" {
			t.Errorf("%q: got %q", form, got)
		}
	}
}
