package console

import (
	"bytes"
	"embed"
	"encoding/json"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticRoot embed.FS

// staticFS serves the style sheet and the script (no inline script: the CSP says script-src 'self').
var staticFS = func() fs.FS {
	f, err := fs.Sub(staticRoot, "static")
	if err != nil {
		panic(err) // the embed directive above guarantees the directory
	}
	return f
}()

var templates = template.Must(template.New("").Funcs(template.FuncMap{
	"time": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"opt": func(v int64) string {
		if v < 0 {
			return "-"
		}
		return strconv.FormatInt(v, 10)
	},
	"signed": func(v *int64) string {
		switch {
		case v == nil:
			return "-"
		case *v > 0:
			return "+" + strconv.FormatInt(*v, 10)
		}
		return strconv.FormatInt(*v, 10)
	},
	"join": strings.Join,
}).ParseFS(templateFS, "templates/*.html"))

// pageData is what every page template receives.
type pageData struct {
	Title    string
	Base     string // Config.BasePath
	CSRF     string // the session's CSRF token ("" for a bearer-token request)
	Who      string // the operator's name
	ReadOnly bool
	Nav      string // the page's entry in the navigation bar
	Error    string
	Notice   string
	Data     any
}

// page fills the fields every page shares.
func (h *Handler) page(r *http.Request, nav, title string, data any) pageData {
	id := identityOf(r)
	p := pageData{Title: title, Base: h.cfg.BasePath, Who: id.name, ReadOnly: h.cfg.ReadOnly, Nav: nav, Data: data}
	if id.session != nil {
		p.CSRF = id.session.csrf
	}
	return p
}

// render executes template name into a buffer, redacts every secret and writes it.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, p pageData) {
	if p.Base == "" {
		p.Base = h.cfg.BasePath
	}
	var buf bytes.Buffer
	if err := templates.ExecuteTemplate(&buf, name, p); err != nil {
		h.log.Error("console: render", zap.String("template", name), zap.Error(err))
		http.Error(w, "console: cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(h.redact(buf.String())))
}

// writeJSON writes v as JSON, every secret redacted.
func (h *Handler) writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		h.log.Error("console: encode JSON", zap.Error(err))
		http.Error(w, `{"error":"cannot encode the answer"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(h.redact(string(b))))
	_, _ = w.Write([]byte("\n"))
}

// apiError is the body of every API error.
type apiError struct {
	Error string `json:"error"`
}

// fail answers an error: JSON on /api/ paths, an HTML page elsewhere.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	msg = h.redact(msg)
	if status >= 500 {
		h.log.Error("console: request failed", zap.String("path", r.URL.Path), zap.Int("status", status), zap.String("error", msg))
	}
	if strings.HasPrefix(r.URL.Path, "/api/") || !acceptsHTML(r) {
		h.writeJSON(w, status, apiError{Error: msg})
		return
	}
	p := h.page(r, "", http.StatusText(status), nil)
	p.Error = msg
	h.render(w, r, status, "error", p)
}

func acceptsHTML(r *http.Request) bool {
	return r.Method != http.MethodGet || strings.Contains(r.Header.Get("Accept"), "text/html") || r.Header.Get("Accept") == ""
}

// decodeJSON reads an action's JSON body into v (unknown fields refused).
func decodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	return nil
}
