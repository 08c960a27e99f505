package console

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"html/template"
	"net/url"
	"strings"
	"testing"
)

// canaryForms are the forms a secret can take in an answer of the console; none may survive.
func canaryForms(secret string) []string {
	js, _ := json.Marshal(secret)
	forms := []string{secret, url.QueryEscape(secret), url.PathEscape(secret), strings.TrimPrefix(url.UserPassword("", secret).String(), ":"),
		hex.EncodeToString([]byte(secret)), template.HTMLEscapeString(secret), strings.Trim(string(js), `"`)}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding} {
		forms = append(forms, enc.EncodeToString([]byte(secret)))
	}
	return forms
}

// hexDumpPairs is the secret as a hex dump's byte column writes it ("63 61 6e").
func hexDumpPairs(secret string) string {
	var b strings.Builder
	for i := 0; i < len(secret); i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(hex.EncodeToString([]byte{secret[i]}))
	}
	return b.String()
}

// Issue 36: masking holds in every rendering — a value holding the password at any offset
// (so a hex dump splits it across two lines), as a header value, base64 of it at each byte
// alignment inside a longer text, URL-escaped, and a prefix cut through it.
func TestMaskHoldsInEveryRendering(t *testing.T) {
	const secret = `canary<P@ss"w/rd>&9`
	m := newMask([]string{secret})
	for off := 0; off < 20; off++ {
		v := []byte(strings.Repeat("x", off) + secret + strings.Repeat("y", 30))
		p := payloadOf(m.Bytes(v, false))
		dump := strings.ReplaceAll(p.Text, "\n", "")
		for _, f := range append(canaryForms(secret), hexDumpPairs(secret[:8]), secret[:8]) {
			if strings.Contains(p.Text, f) {
				t.Errorf("offset %d: the dump shows %q:\n%s", off, f, p.Text)
			}
		}
		if strings.Contains(dump, "canary<P") {
			t.Errorf("offset %d: the ASCII column shows the secret across lines", off)
		}
		for k := 0; k < 3; k++ {
			b64 := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("z", k+off) + secret + "tail"))
			got := m.String("Authorization: Basic " + b64)
			whole := base64.StdEncoding.EncodeToString([]byte(secret))
			if strings.Contains(got, whole[4:16]) || got == "Authorization: Basic "+b64 {
				t.Errorf("base64 at alignment %d, offset %d: %q not masked", k, off, got)
			}
		}
	}
	for cut := 1; cut < len(secret); cut++ {
		got := string(m.Bytes([]byte("prefix "+secret[:cut]), true))
		if strings.Contains(got, secret[:cut]) && cut >= 1 {
			t.Errorf("a prefix cut after %d bytes of the secret shows them: %q", cut, got)
		}
	}
	// In an attribute value, html/template also escapes + = and `.
	attr := newMask([]string{"pa+ss=wd"})
	var b strings.Builder
	if err := template.Must(template.New("").Parse(`<input value="{{.}}">`)).Execute(&b, "pa+ss=wd"); err != nil {
		t.Fatal(err)
	}
	if got := attr.String(b.String()); strings.Contains(got, "pa") || !strings.Contains(got, "***") {
		t.Errorf("attribute rendering %q masked as %q", b.String(), got)
	}
	for _, f := range canaryForms(secret) {
		if got := m.String("x " + f + " y"); got != "x *** y" {
			t.Errorf("%q: got %q", f, got)
		}
	}
	if got := m.String("ordinary text, no secret"); got != "ordinary text, no secret" {
		t.Errorf("ordinary text changed: %q", got)
	}
}
