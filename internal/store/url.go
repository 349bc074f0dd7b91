package store

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// CheckURL reports what is wrong with a database URL, or nil: "sqlite:PATH",
// or a PostgreSQL URL whose parts (user, password, hosts, database, query)
// read the same to pgx, which splits a URL as libpq does, as they do to a
// person and to net/url. Its errors never quote the URL.
//
// libpq ends the user name and password at the first '@' before any '/',
// so an unescaped '@' in a password makes the rest of it the host that is
// dialled (and quoted by "no such host"), and an unescaped '/' makes part
// of it the port and the rest the database name. Such URLs are refused, as
// are a '#' (a fragment to net/url, part of the password to libpq) and a
// '?' before that '@', with advice to percent-encode.
func CheckURL(rawURL string) error {
	if path, ok := strings.CutPrefix(rawURL, "sqlite:"); ok {
		switch {
		case path == "":
			return errors.New("sqlite: needs a file path, such as sqlite:/var/lib/paymentsd/records.db, or sqlite::memory:")
		case strings.ContainsAny(path, "?#"):
			return errors.New("the SQLite path holds a '?' or '#': want a file path alone")
		}
		return nil
	}
	u, ok := splitPostgresURL(rawURL)
	if !ok {
		return errors.New(`want sqlite:PATH or a postgres:// (or postgresql://) URL`)
	}
	return u.check()
}

// errAmbiguousURL refuses a PostgreSQL URL whose password (or user name)
// may run into its host, database or query.
var errAmbiguousURL = errors.New("the URL's user name or password holds an unescaped '@', '/', '?' or '#', so where the password ends can't be told for sure: " +
	"percent-encode those characters in the user name and password (@ as %40, / as %2F, ? as %3F, # as %23, and % itself as %25)")

// pgURL is a PostgreSQL URL split as pgx and libpq split it; every part is
// as written (not percent-decoded).
type pgURL struct {
	scheme   string
	userinfo string // before the first '@' that precedes any '/'
	hasUser  bool
	hosts    string // host[:port][,host[:port]…]
	path     string // after the '/' that ends the hosts, up to any '?'
	query    string // after the '?'
}

func splitPostgresURL(rawURL string) (pgURL, bool) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok || (scheme != "postgres" && scheme != "postgresql") {
		return pgURL{}, false
	}
	u := pgURL{scheme: scheme}
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		u.userinfo, u.hasUser, rest = rest[:i], true, rest[i+1:]
	}
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	u.hosts, rest = rest[:end], rest[end:]
	if r, ok := strings.CutPrefix(rest, "/"); ok {
		u.path, rest, _ = strings.Cut(r, "?")
		rest = "?" + rest
	}
	u.query = strings.TrimPrefix(rest, "?")
	return u, true
}

// params are the query's name=value pairs, as written.
func (u pgURL) params() [][2]string {
	var out [][2]string
	for _, p := range strings.Split(u.query, "&") {
		if p == "" {
			continue
		}
		k, v, _ := strings.Cut(p, "=")
		out = append(out, [2]string{k, v})
	}
	return out
}

func (u pgURL) check() error {
	switch {
	case strings.Contains(u.userinfo+u.hosts+u.path+u.query, "#"),
		strings.ContainsAny(u.userinfo, "?"),
		strings.Contains(u.hosts, "@"),
		strings.Contains(u.path, "@"):
		return errAmbiguousURL
	}
	hostParam := false
	for i, p := range strings.Split(u.query, "&") {
		if p == "" {
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		switch {
		case strings.Contains(k, "@"):
			return errAmbiguousURL
		case !ok || strings.Contains(v, "="):
			return fmt.Errorf("query parameter %d is not one name=value pair (percent-encode '=' and '&' in values as %%3D and %%26)", i+1)
		}
		if dk, _ := url.QueryUnescape(k); dk == "host" || dk == "hostaddr" || dk == "service" {
			hostParam = hostParam || v != ""
		}
	}
	if !validEscapes(u.userinfo) || !validEscapes(u.hosts) || !validEscapes(u.path) || !validEscapes(u.query) {
		return errors.New("the URL holds a '%' not followed by two hex digits: percent-encode a '%' in the password as %25")
	}
	if u.hosts == "" && !hostParam {
		return errors.New("the URL names no host, in the URL or as host= in its query")
	}
	return nil
}

// validEscapes reports whether every '%' in s starts a %XX escape.
func validEscapes(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return false
		}
		i += 2
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
