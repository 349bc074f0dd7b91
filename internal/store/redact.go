package store

import (
	"context"
	"errors"
	"net/url"
	"regexp"
	"strings"
)

// shownParams are the query parameters that say where pgx connects, and
// as whom: shown so that the host shown is the host dialled. No other
// parameter is shown: password and sslpassword are secrets, and others
// may hold one pasted by mistake.
var shownParams = map[string]bool{"host": true, "hostaddr": true, "port": true, "user": true, "dbname": true, "database": true, "service": true}

// RedactedURL is rawURL as it may be shown, in a log line or anywhere
// else. For PostgreSQL that is the scheme, user, hosts, ports and database
// name, as pgx reads them, and the query parameters that change where it
// connects (host=, hostaddr=, port=, user=, dbname=, service=): never the
// password, nor any other parameter (pgx reads password and sslpassword
// there too). For SQLite it is the path. ok is false, and shown the scheme
// alone, if CheckURL refuses rawURL; Open refuses such a URL too.
func RedactedURL(rawURL string) (shown string, ok bool) {
	const redacted = "[REDACTED]"
	if path, isSQLite := strings.CutPrefix(rawURL, "sqlite:"); isSQLite {
		if i := strings.IndexAny(path, "?#"); i >= 0 {
			return "sqlite:" + path[:i] + redacted, false
		}
		return rawURL, CheckURL(rawURL) == nil
	}
	u, isPG := splitPostgresURL(rawURL)
	if !isPG {
		return redacted, false
	}
	if u.check() != nil {
		return u.scheme + "://" + redacted, false
	}
	var b strings.Builder
	b.WriteString(u.scheme + "://")
	if user, _, _ := strings.Cut(u.userinfo, ":"); user != "" {
		b.WriteString(user + "@")
	}
	b.WriteString(u.hosts)
	if u.path != "" {
		b.WriteString("/" + u.path)
	}
	sep := "?"
	for _, p := range u.params() {
		if k, _ := url.QueryUnescape(p[0]); shownParams[k] {
			b.WriteString(sep + p[0] + "=" + p[1])
			sep = "&"
		}
	}
	shown = b.String()
	// A last guard, should the split above and the forms in secrets ever
	// disagree about where the password is.
	for _, s := range secrets(rawURL) {
		if strings.Contains(shown, s) {
			return u.scheme + "://" + redacted, true
		}
	}
	return shown, true
}

// secrets lists the forms in which rawURL's password could appear in an
// error message: as written, URL-decoded, and re-encoded. It parses by hand
// as well as with net/url, since a URL net/url can't parse must still be
// kept out of error messages.
func secrets(rawURL string) []string {
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s)
		if d, err := url.PathUnescape(s); err == nil && d != s {
			out = append(out, d)
		}
		if d, err := url.QueryUnescape(s); err == nil && d != s {
			out = append(out, d)
		}
		if e := url.QueryEscape(s); e != s {
			out = append(out, e)
		}
		if e := url.PathEscape(s); e != s {
			out = append(out, e)
		}
	}
	if u, err := url.Parse(rawURL); err == nil {
		if p, ok := u.User.Password(); ok {
			add(p)
		}
		for k, vs := range u.Query() {
			if strings.EqualFold(k, "password") {
				for _, v := range vs {
					add(v)
				}
			}
		}
	}
	// scheme://user:password@host…: the password runs from the first ':'
	// after "//" to the last '@' before the path.
	if _, rest, ok := strings.Cut(rawURL, "//"); ok {
		authority := rest
		if i := strings.IndexAny(authority, "/?"); i >= 0 && strings.LastIndexByte(authority[:i], '@') >= 0 {
			authority = authority[:i]
		}
		if at := strings.LastIndexByte(authority, '@'); at >= 0 {
			if _, pw, ok := strings.Cut(authority[:at], ":"); ok {
				add(pw)
				// Should a parser end the password at an unescaped
				// '@', '/', '?' or '#' in it, each piece could be shown
				// as another part of the URL.
				for _, piece := range strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("@/?#", r) }) {
					if len(piece) >= 4 && piece != pw {
						add(piece)
					}
				}
			}
		}
	}
	// As pgx (and libpq) read it: up to the first '@' before any '/'.
	if u, ok := splitPostgresURL(rawURL); ok && u.hasUser {
		if _, pw, ok := strings.Cut(u.userinfo, ":"); ok {
			add(pw)
		}
	}
	for _, m := range regexp.MustCompile(`(?i)password=([^&\s]+)`).FindAllStringSubmatch(rawURL, -1) {
		add(m[1])
	}
	return out
}

// redactedError is an error whose message had a password removed. It keeps
// the original only to answer errors.Is for context errors and the store's
// sentinels, never for its text.
type redactedError struct {
	msg   string
	cause error
}

func (e *redactedError) Error() string { return e.msg }

func (e *redactedError) Is(target error) bool {
	switch target {
	case context.Canceled, context.DeadlineExceeded, ErrNotFound, ErrWrongEnvironment, ErrKeyNotStorable, ErrCommitUnknown,
		ErrConnectTimeout, ErrMigrateTimeout, ErrInboxFull, ErrNotUnknown, ErrInFlight, ErrChanged, ErrClosed:
		return errors.Is(e.cause, target)
	}
	return false
}

// redact returns err, or an error with the same message less any of the
// secrets, if its message holds one.
func redact(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	found := false
	for _, s := range secrets {
		if strings.Contains(msg, s) {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
			found = true
		}
	}
	if !found {
		return err
	}
	return &redactedError{msg: msg, cause: err}
}
