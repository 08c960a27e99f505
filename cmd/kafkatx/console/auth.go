package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"

	"go.uber.org/zap"
)

// cookieName is the session cookie's name.
const cookieName = "kafkatx_console"

// tokenSource holds the token of a file, read again when the file's size or modification time
// changes (checked at most once a second). An unreadable, empty or too short file leaves no
// token: every request is refused until it is fixed.
type tokenSource struct {
	path string
	log  *zap.Logger

	mu      sync.Mutex
	checked time.Time
	mod     time.Time
	size    int64
	sum     [32]byte // SHA-256 of the token; zero when there is none
}

func newTokenSource(path string, log *zap.Logger) (*tokenSource, error) {
	ts := &tokenSource{path: path, log: log}
	if err := ts.load(); err != nil {
		return nil, err
	}
	return ts, nil
}

// load reads the file (its path may be logged, never its content).
func (ts *tokenSource) load() error {
	fi, err := os.Stat(ts.path)
	if err != nil {
		ts.sum = [32]byte{}
		return fmt.Errorf("console: token file: %w", err)
	}
	b, err := os.ReadFile(ts.path)
	if err != nil {
		ts.sum = [32]byte{}
		return fmt.Errorf("console: token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	ts.mod, ts.size = fi.ModTime(), fi.Size()
	switch {
	case len(tok) < MinTokenBytes:
		ts.sum = [32]byte{}
		return fmt.Errorf("console: token file %s holds %d bytes after trimming: want at least %d (for example: head -c 24 /dev/urandom | base64 > %s)",
			ts.path, len(tok), MinTokenBytes, ts.path)
	case strings.ContainsFunc(tok, unicode.IsSpace):
		ts.sum = [32]byte{}
		return fmt.Errorf("console: token file %s: the token contains white space", ts.path)
	}
	ts.sum = sha256.Sum256([]byte(tok))
	return nil
}

// current returns the SHA-256 of the current token, and false when there is none.
func (ts *tokenSource) current() ([32]byte, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if time.Since(ts.checked) >= time.Second {
		ts.checked = time.Now()
		fi, err := os.Stat(ts.path)
		if err != nil || !fi.ModTime().Equal(ts.mod) || fi.Size() != ts.size {
			if err := ts.load(); err != nil {
				ts.log.Error("console: no usable token: every request is refused", zap.Error(err))
			} else {
				ts.log.Info("console: token file changed: sessions opened with the previous token end", zap.String("path", ts.path))
			}
		}
	}
	return ts.sum, ts.sum != [32]byte{}
}

// matches reports, in constant time, whether tok is the current token.
func (ts *tokenSource) matches(tok string) ([32]byte, bool) {
	sum, ok := ts.current()
	if !ok {
		return sum, false
	}
	got := sha256.Sum256([]byte(tok))
	return sum, subtle.ConstantTimeCompare(got[:], sum[:]) == 1
}

// session is a signed-in browser.
type session struct {
	csrf    string
	token   [32]byte // SHA-256 of the token it signed in with
	name    string   // the operator's name, as typed at sign-in
	expires time.Time
}

// sessionStore keeps sessions in memory: a restart signs everyone out.
type sessionStore struct {
	mu sync.Mutex
	m  map[string]*session
}

// maxSessions bounds the store; the oldest sessions go first.
const maxSessions = 1000

func newSessionStore() *sessionStore { return &sessionStore{m: map[string]*session{}} }

func (s *sessionStore) add(sess *session) string {
	id := randomString(32)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for k, v := range s.m {
		if now.After(v.expires) {
			delete(s.m, k)
		}
	}
	for len(s.m) >= maxSessions {
		var oldest string
		for k, v := range s.m {
			if oldest == "" || v.expires.Before(s.m[oldest].expires) {
				oldest = k
			}
		}
		delete(s.m, oldest)
	}
	s.m[id] = sess
	return id
}

func (s *sessionStore) get(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.m[id]
	if sess != nil && time.Now().After(sess.expires) {
		delete(s.m, id)
		return nil
	}
	return sess
}

func (s *sessionStore) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

func randomString(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// identity is who sent a request.
type identity struct {
	session *session // nil for a bearer-token request
	name    string   // the operator's name ("api" for a bearer-token request without X-Kafkatx-Actor)
	addr    string   // the remote address's host
}

type identityKey struct{}

// badBearerKey marks a request whose bearer token is wrong: 401, never the sign-in redirect.
type badBearerKey struct{}

func withIdentity(ctx context.Context, id identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

func identityOf(r *http.Request) identity {
	id, _ := r.Context().Value(identityKey{}).(identity)
	return id
}

// actor is what audit rows record for a request: the operator's name, "via console from"
// the remote address, and the console process (OS user at host).
func (h *Handler) actor(r *http.Request) string {
	id := identityOf(r)
	return fmt.Sprintf("%s via console from %s (%s)", id.name, id.addr, h.cfg.Actor)
}

// cleanName keeps an operator's name printable and short (at most 64 bytes).
func cleanName(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, strings.TrimSpace(s))
	for len(s) > 64 {
		s = s[:len(s)-1]
	}
	return strings.ToValidUTF8(s, "")
}

func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// authenticate finds who sent r: a bearer token (which must be right when present), else a
// session cookie. It answers 401 (API) or redirects to the sign-in page (pages) otherwise.
func (h *Handler) authenticate(w http.ResponseWriter, r *http.Request) (identity, bool) {
	if auth := r.Header.Get("Authorization"); auth != "" {
		tok, ok := "", len(auth) > 7 && strings.EqualFold(auth[:7], "Bearer ") // the scheme is case-insensitive (RFC 9110)
		if ok {
			tok = auth[7:]
		}
		if _, match := h.tokens.matches(strings.TrimSpace(tok)); ok && match {
			name := cleanName(r.Header.Get("X-Kafkatx-Actor"))
			if name == "" {
				name = "api"
			}
			return identity{name: name, addr: remoteHost(r)}, true
		}
		h.slowDown()
		h.unauthorized(w, r.WithContext(context.WithValue(r.Context(), badBearerKey{}, true)), "wrong token")
		return identity{}, false
	}
	if c, err := r.Cookie(cookieName); err == nil {
		if sess := h.sessions.get(c.Value); sess != nil {
			if sum, ok := h.tokens.current(); ok && sum == sess.token {
				return identity{session: sess, name: sess.name, addr: remoteHost(r)}, true
			}
			h.sessions.remove(c.Value) // the token changed: the session ends
		}
	}
	h.unauthorized(w, r, "sign in first")
	return identity{}, false
}

func (h *Handler) unauthorized(w http.ResponseWriter, r *http.Request, why string) {
	bad, _ := r.Context().Value(badBearerKey{}).(bool)
	if !bad && !strings.HasPrefix(r.URL.Path, "/api/") && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		http.Redirect(w, r, h.cfg.BasePath+"/signin", http.StatusSeeOther)
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="kafkatx console"`)
	h.fail(w, r, http.StatusUnauthorized, "unauthorized: "+why+" (Authorization: Bearer <token> or a signed-in session)")
}

// checkCSRF accepts a state-changing session request that carries the session's CSRF token
// (the X-CSRF-Token header or the csrf form field) and, when the browser sends an Origin
// header, comes from this host.
func (h *Handler) checkCSRF(r *http.Request, sess *session) bool {
	if !sameOrigin(r, r.Header.Get("Origin")) {
		return false
	}
	got := r.Header.Get("X-CSRF-Token")
	if got == "" {
		got = r.PostFormValue("csrf")
	}
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) == 1
}

// sameOrigin reports whether origin (the request's Origin header) is the console's own host;
// a request without one (or "null") passes: the CSRF token decides.
func sameOrigin(r *http.Request, origin string) bool {
	return origin == "" || origin == "null" || strings.HasSuffix(origin, "://"+r.Host)
}

// failMu serializes the answers to wrong tokens, each held failDelay: guessing gets at most
// a few tries a second, however many connections it opens.
var failMu sync.Mutex

// failDelay is how long a wrong token's answer waits.
const failDelay = 250 * time.Millisecond

func (h *Handler) slowDown() {
	failMu.Lock()
	defer failMu.Unlock()
	time.Sleep(failDelay)
}

// signinPage shows the sign-in form.
func (h *Handler) signinPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusOK, "signin", pageData{Title: "Sign in"})
}

// signin checks the token typed in the form and opens a session.
func (h *Handler) signin(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, "bad form: "+err.Error())
		return
	}
	sum, ok := h.tokens.matches(strings.TrimSpace(r.PostFormValue("token")))
	if !ok {
		h.slowDown()
		h.log.Warn("console: failed sign-in", zap.String("from", remoteHost(r)))
		h.render(w, r, http.StatusUnauthorized, "signin", pageData{Title: "Sign in", Error: "wrong token"})
		return
	}
	name := cleanName(r.PostFormValue("name"))
	if name == "" {
		name = "operator"
	}
	id := h.sessions.add(&session{csrf: randomString(32), token: sum, name: name, expires: time.Now().Add(SessionTTL)})
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: h.cfg.BasePath + "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(SessionTTL.Seconds())})
	h.log.Info("console: signed in", zap.String("name", name), zap.String("from", remoteHost(r)))
	http.Redirect(w, r, h.cfg.BasePath+"/", http.StatusSeeOther)
}

// signout ends the session.
func (h *Handler) signout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(cookieName); err == nil {
		h.sessions.remove(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: h.cfg.BasePath + "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, r, h.cfg.BasePath+"/signin", http.StatusSeeOther)
}
