package admin

import (
	"embed"
	"io/fs"
	"net/http"
)

// web holds the dashboard: plain HTML, CSS and JavaScript, no build step.
//
//go:embed web
var web embed.FS

// webHandler serves the dashboard's files.
func webHandler() http.Handler {
	sub, err := fs.Sub(web, "web")
	if err != nil {
		panic(err)
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, "GET")
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
