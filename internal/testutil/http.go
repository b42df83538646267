package testutil

import "net/http"

// ResponseCounter is an [http.ResponseWriter] that counts the body and
// drops it, so that a benchmark of a handler measures the handler and
// not a recorder's copying.
type ResponseCounter struct {
	// Code is the status written; 0 before any.
	Code int
	// N is the body's length so far.
	N      int
	header http.Header
}

// Header returns the response's header.
func (d *ResponseCounter) Header() http.Header {
	if d.header == nil {
		d.header = http.Header{}
	}
	return d.header
}

// WriteHeader records the first status written.
func (d *ResponseCounter) WriteHeader(code int) {
	if d.Code == 0 {
		d.Code = code
	}
}

// Write counts p.
func (d *ResponseCounter) Write(p []byte) (int, error) {
	d.WriteHeader(http.StatusOK)
	d.N += len(p)
	return len(p), nil
}
