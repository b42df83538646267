package admin

import (
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Paging limits, as in RabbitMQ's management API.
const (
	defaultPageSize = 100
	maxPageSize     = 500
)

// listQuery holds the query parameters every list takes.
type listQuery struct {
	columns  []string
	sort     string
	reverse  bool
	paged    bool
	page     int
	pageSize int
	name     string         // filter: names containing this (ASCII case folded)
	re       *regexp.Regexp // filter: names matching this (use_regex=true)
}

// parseColumns reads ?columns=a,b.c.
func parseColumns(v url.Values) []string {
	var cols []string
	for _, s := range v["columns"] {
		for c := range strings.SplitSeq(s, ",") {
			if c = strings.TrimSpace(c); c != "" {
				cols = append(cols, c)
			}
		}
	}
	return cols
}

func parseBool(v url.Values, name string) (bool, error) {
	s := v.Get(name)
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, badRequest("%s=%q: want true or false", name, s)
	}
	return b, nil
}

func parseListQuery(v url.Values) (listQuery, error) {
	q := listQuery{columns: parseColumns(v), sort: v.Get("sort"), page: 1, pageSize: defaultPageSize}
	var err error
	if q.reverse, err = parseBool(v, "sort_reverse"); err != nil {
		return q, err
	}
	if s := v.Get("page"); s != "" {
		q.paged = true
		if q.page, err = strconv.Atoi(s); err != nil || q.page < 1 {
			return q, badRequest("page=%q: want a page number from 1", s)
		}
	}
	if s := v.Get("page_size"); s != "" {
		q.paged = true
		if q.pageSize, err = strconv.Atoi(s); err != nil || q.pageSize < 1 || q.pageSize > maxPageSize {
			return q, badRequest("page_size=%q: want 1 to %d", s, maxPageSize)
		}
	}
	useRegex, err := parseBool(v, "use_regex")
	if err != nil {
		return q, err
	}
	if name := v.Get("name"); name != "" {
		if useRegex {
			if q.re, err = regexp.Compile(name); err != nil {
				return q, badRequest("name=%q is not a valid regular expression: %v", name, err)
			}
		} else {
			q.name = strings.ToLower(name)
		}
	}
	return q, nil
}

// keep reports whether a name passes the name filter.
func (q *listQuery) keep(name string) bool {
	switch {
	case q.re != nil:
		return q.re.MatchString(name)
	case q.name != "":
		return containsFold(name, q.name)
	}
	return true
}

// containsFold reports whether s contains lower, which is lower case,
// folding ASCII letters of s; it allocates nothing.
func containsFold(s, lower string) bool {
	n := len(lower)
	for i := 0; i+n <= len(s); i++ {
		j := 0
		for ; j < n; j++ {
			c := s[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != lower[j] {
				break
			}
		}
		if j == n {
			return true
		}
	}
	return false
}

// serveList answers a list request: rows come in the schema's natural
// order; it filters them by name, sorts them if asked (a bounded
// selection when only one page is wanted), pages them and writes only the
// selected columns. Without page or page_size it writes a JSON array;
// with them, RabbitMQ's paged object:
//
//	{"filtered_count": f, "item_count": n, "items": [...], "page": p,
//	 "page_count": pc, "page_size": ps, "total_count": t}
func serveList[R any](w http.ResponseWriter, r *http.Request, s *schema[R], rows []R, nameOf func(*R) string) {
	q, err := parseListQuery(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	fields, err := s.selectColumns(q.columns)
	if err != nil {
		writeError(w, err)
		return
	}
	var sortBy *field[R]
	if q.sort != "" {
		if sortBy, err = s.sortField(q.sort); err != nil {
			writeError(w, err)
			return
		}
	}
	total := len(rows)
	if q.name != "" || q.re != nil {
		kept := rows[:0]
		for i := range rows {
			if q.keep(nameOf(&rows[i])) {
				kept = append(kept, rows[i])
			}
		}
		rows = kept
	}
	filtered := len(rows)
	first, last := 0, filtered // the slice of the ordered rows to write
	if q.paged {
		pages := (filtered + q.pageSize - 1) / q.pageSize
		if q.page > max(pages, 1) {
			writeError(w, badRequest("page %d out of range: %d page(s) of %d", q.page, pages, q.pageSize))
			return
		}
		first, last = (q.page-1)*q.pageSize, min(q.page*q.pageSize, filtered)
	}
	switch {
	case sortBy != nil && sortBy != s.byPath[s.natural]:
		rows = sortRows(rows, sortBy, q.reverse, last)
	case q.reverse:
		// The natural order, backwards: no sorting needed.
		rows = rows[max(filtered-last, 0) : filtered-first]
		rev := make([]R, len(rows))
		for i := range rows {
			rev[len(rows)-1-i] = rows[i]
		}
		rows, first, last = rev, 0, len(rev)
	}
	rows = rows[first:last]

	out := newStream(w)
	defer out.close()
	b := out.b
	if q.paged {
		pages := (filtered + q.pageSize - 1) / q.pageSize
		b = append(b, `{"filtered_count":`...)
		b = strconv.AppendInt(b, int64(filtered), 10)
		b = append(b, `,"item_count":`...)
		b = strconv.AppendInt(b, int64(len(rows)), 10)
		b = append(b, `,"items":`...)
		b = out.array(b, len(rows), func(b []byte, i int) []byte { return appendObject(b, &rows[i], fields) })
		b = append(b, `,"page":`...)
		b = strconv.AppendInt(b, int64(q.page), 10)
		b = append(b, `,"page_count":`...)
		b = strconv.AppendInt(b, int64(pages), 10)
		b = append(b, `,"page_size":`...)
		b = strconv.AppendInt(b, int64(q.pageSize), 10)
		b = append(b, `,"total_count":`...)
		b = strconv.AppendInt(b, int64(total), 10)
		b = append(b, '}')
	} else {
		b = out.array(b, len(rows), func(b []byte, i int) []byte { return appendObject(b, &rows[i], fields) })
	}
	out.b = b
}

// stream writes a long JSON answer in pieces of about streamChunk bytes
// from a pooled buffer, so that a list of 100,000 objects is never held
// whole in memory. A short answer goes out in one write, with its
// Content-Length.
type stream struct {
	w       http.ResponseWriter
	b       []byte
	started bool
}

const streamChunk = 32 << 10

var streamBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2*streamChunk); return &b }}

func newStream(w http.ResponseWriter) *stream {
	return &stream{w: w, b: (*streamBufs.Get().(*[]byte))[:0]}
}

// flush writes b out once it is a chunk long, and returns it emptied.
func (s *stream) flush(b []byte) []byte {
	if len(b) < streamChunk {
		return b
	}
	if !s.started {
		s.header()
	}
	s.w.Write(b)
	return b[:0]
}

func (s *stream) header() {
	h := s.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	s.w.WriteHeader(http.StatusOK)
	s.started = true
}

// array appends a JSON array of n elements that elem appends.
func (s *stream) array(b []byte, n int, elem func(b []byte, i int) []byte) []byte {
	b = append(b, '[')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = elem(b, i)
		b = s.flush(b)
	}
	return append(b, ']')
}

// close writes what is left and returns the buffer to the pool.
func (s *stream) close() {
	if !s.started {
		s.header()
	}
	s.w.Write(s.b)
	if cap(s.b) <= 4*streamChunk {
		b := s.b[:0]
		streamBufs.Put(&b)
	}
}

// serveObject writes one object with the columns the request selects.
func serveObject[R any](w http.ResponseWriter, r *http.Request, s *schema[R], row *R, status int) {
	fields, err := s.selectColumns(parseColumns(r.URL.Query()))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSONBytes(w, status, appendObject(nil, row, fields))
}
