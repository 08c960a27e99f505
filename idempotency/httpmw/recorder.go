package httpmw

import (
	"bytes"
	"net/http"
	"strconv"
)

// recorder buffers the handler's response, so that nothing reaches the client before the
// transaction holding the handler's work and the stored response has committed.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

var _ http.ResponseWriter = (*recorder)(nil)

func newRecorder() *recorder { return &recorder{header: http.Header{}, status: http.StatusOK} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.wroteHeader || status < 200 {
		return // 1xx informational responses are not recorded
	}
	r.status, r.wroteHeader = status, true
}

func (r *recorder) Write(p []byte) (int, error) {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	return r.body.Write(p)
}

// flushTo writes the buffered response to w.
func (r *recorder) flushTo(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	if w.Header().Get("Content-Length") == "" && w.Header().Get("Transfer-Encoding") == "" {
		w.Header().Set("Content-Length", strconv.Itoa(r.body.Len()))
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}
