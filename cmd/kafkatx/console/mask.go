package console

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"html/template"
	"net/url"
	"strings"

	"github.com/kafkatx/kafkatx/dlq"
)

// mask is the console's one place for secrets: every answer passes through text (HTML and
// JSON, errors included, export files too), and the bytes of a dead letter or an outbox row
// pass through bytes before they are formatted, so a hex dump's byte and ASCII columns and
// a summary's escaped prefix never hold a secret, however the dump splits its lines.
type mask struct {
	secrets [][]byte          // the raw secrets, 3 bytes or more
	text    *strings.Replacer // each secret in every form it travels in, as "***"
}

// htmlContexts are the places the pages put data, as html/template escapes each: text, a
// quoted attribute, a URL's query in an attribute.
var htmlContexts = template.Must(template.New("").Parse(`<p>{{.}}</p>` + "\x00" + `<i title="{{.}}">` + "\x00" + `<a href="/x?q={{.}}">`))

// htmlForms is s as html/template writes it in each of htmlContexts.
func htmlForms(s string) []string {
	var b strings.Builder
	if err := htmlContexts.Execute(&b, s); err != nil {
		return nil
	}
	var out []string
	for i, part := range strings.Split(b.String(), "\x00") {
		pre, post := []string{"<p>", `<i title="`, `<a href="/x?q=`}[i], []string{"</p>", `">`, `">`}[i]
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(part, pre), post))
	}
	return out
}

// minSecret is the shortest secret masked: a shorter one would blank ordinary text.
const minSecret = 3

// minBase64Core is the shortest base64 fragment of a secret at an unaligned offset that is
// masked (a fragment of a short secret is too common a string to blank).
const minBase64Core = 6

func newMask(list []string) *mask {
	m := &mask{}
	var pairs []string
	add := func(forms ...string) {
		for _, f := range forms {
			if len(f) >= minSecret {
				pairs = append(pairs, f, "***")
			}
		}
	}
	for _, s := range list {
		if len(s) < minSecret {
			continue
		}
		m.secrets = append(m.secrets, []byte(s))
		// As is; query-, path- and userinfo-escaped (a DSN quoted in an error: "p%40ss%20w%2Frd");
		// hex (lower and upper case); HTML-escaped (html/template's form); JSON-escaped
		// (json.Marshal's \u003c for <, \" ...); CSV-quoted ("" for "); base64 in the standard
		// and URL alphabets, padded and not, at each of the three byte alignments it can have
		// inside a longer base64 text (a Basic Authorization header, a token blob).
		userinfo := strings.TrimPrefix(url.UserPassword("", s).String(), ":")
		js, _ := json.Marshal(s)
		add(htmlForms(s)...)
		add(s, url.QueryEscape(s), url.PathEscape(s), userinfo, hex.EncodeToString([]byte(s)), strings.ToUpper(hex.EncodeToString([]byte(s))),
			template.HTMLEscapeString(s), strings.Trim(string(js), `"`), strings.ReplaceAll(s, `"`, `""`))
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
			add(enc.EncodeToString([]byte(s)))
			for k := 0; k < 3; k++ {
				if core := base64Core(enc, []byte(s), k); len(core) >= minBase64Core {
					add(core)
				}
			}
		}
	}
	// Longest forms first: a replacer tries its pairs in order at each position.
	sortPairsLongestFirst(pairs)
	m.text = strings.NewReplacer(pairs...)
	return m
}

// base64Core is the part of s's base64 encoding that is the same whatever bytes come before
// (k of them, k mod 3) and after it.
func base64Core(enc *base64.Encoding, s []byte, k int) string {
	b := append(make([]byte, k), s...)
	e := enc.EncodeToString(b)
	start := (k*8 + 5) / 6 // the characters that hold bits of the k leading bytes
	end := len(b) * 8 / 6  // the characters wholly made of b's bits
	if end > len(e) {
		end = len(e)
	}
	if start >= end {
		return ""
	}
	return e[start:end]
}

func sortPairsLongestFirst(pairs []string) {
	type pair struct{ old, new string }
	ps := make([]pair, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		ps = append(ps, pair{pairs[i], pairs[i+1]})
	}
	for i := 1; i < len(ps); i++ { // insertion sort: a handful of pairs
		for j := i; j > 0 && len(ps[j].old) > len(ps[j-1].old); j-- {
			ps[j], ps[j-1] = ps[j-1], ps[j]
		}
	}
	for i, p := range ps {
		pairs[2*i], pairs[2*i+1] = p.old, p.new
	}
}

// String masks every secret in s, in each of its forms.
func (m *mask) String(s string) string { return m.text.Replace(s) }

// Bytes masks every secret in b (raw and in its text forms) and, when b was cut (cut: it is
// a prefix of the whole), a secret's beginning at its end. A nil b stays nil.
func (m *mask) Bytes(b []byte, cut bool) []byte {
	if b == nil {
		return nil
	}
	out := []byte(m.text.Replace(string(b)))
	if cut {
		for _, s := range m.secrets {
			for l := min(len(s)-1, len(out)); l >= 1; l-- {
				if bytes.HasSuffix(out, s[:l]) {
					out = append(out[:len(out)-l:len(out)-l], "***"...)
					break
				}
			}
		}
	}
	return out
}

// DeadLetter masks d's key, value, headers (keys and values), error and stack in place.
// keySize and valueSize are the whole key's and value's sizes: a list reads only their
// first bytes, and a cut one is masked at its end too.
func (m *mask) DeadLetter(d *dlq.DeadLetter, keySize, valueSize int) {
	d.Key, d.Value = m.Bytes(d.Key, len(d.Key) < keySize), m.Bytes(d.Value, len(d.Value) < valueSize)
	d.ErrorMessage, d.Stack = m.String(d.ErrorMessage), m.String(d.Stack)
	for i := range d.Headers {
		d.Headers[i].Key = m.String(d.Headers[i].Key)
		d.Headers[i].Value = m.Bytes(d.Headers[i].Value, false)
	}
}
