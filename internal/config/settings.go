package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"example.com/paymentsd/internal/service"
)

func durationSetting(field func(*Config) *time.Duration) setting {
	return setting{
		parse: func(c *Config, v string) error { return parseDuration(v, field(c)) },
		show:  func(c *Config) slog.Value { return slog.StringValue(field(c).String()) },
	}
}

// minDurationSetting is durationSetting for a duration that must be at
// least lo, such as a polling interval that would otherwise spin.
func minDurationSetting(lo time.Duration, field func(*Config) *time.Duration) setting {
	s := durationSetting(field)
	parse := s.parse
	s.parse = func(c *Config, v string) error {
		if err := parse(c, v); err != nil {
			return err
		}
		if *field(c) < lo {
			return fmt.Errorf("want at least %v", lo)
		}
		return nil
	}
	return s
}

func parseDuration(v string, d *time.Duration) error {
	p, err := time.ParseDuration(v)
	if err != nil || p <= 0 {
		return errors.New("want a positive Go duration such as 15s")
	}
	*d = p
	return nil
}

func intSetting(lo, hi int, field func(*Config) *int) setting {
	return setting{
		parse: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < lo || n > hi {
				return fmt.Errorf("want a whole number from %d to %d", lo, hi)
			}
			*field(c) = n
			return nil
		},
		show: func(c *Config) slog.Value { return slog.IntValue(*field(c)) },
	}
}

func int64Setting(lo, hi int64, field func(*Config) *int64) setting {
	return setting{
		parse: func(c *Config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < lo || n > hi {
				return fmt.Errorf("want a whole number from %d to %d", lo, hi)
			}
			*field(c) = n
			return nil
		},
		show: func(c *Config) slog.Value { return slog.Int64Value(*field(c)) },
	}
}

// addrSetting reads a listen address, host:port or :port; "" (no default)
// means none.
func addrSetting(field func(*Config) *string) setting {
	return setting{
		parse: func(c *Config, v string) error {
			*field(c) = v
			if v == "" {
				return nil
			}
			host, port, err := net.SplitHostPort(v)
			if err != nil {
				return errors.New("want host:port or :port, such as :9090")
			}
			var problems []error
			if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
				problems = append(problems, errors.New("the port must be a number from 0 to 65535"))
			}
			if host != "" && net.ParseIP(host) == nil && !validHostname(host) {
				problems = append(problems, errors.New("the host must be an IP address or a host name"))
			}
			return errors.Join(problems...)
		},
		show: func(c *Config) slog.Value { return slog.StringValue(*field(c)) },
	}
}

// fileSetting reads a variable that names a file, refusing one that names
// no readable file.
func fileSetting(field func(*Config) *string) setting {
	return setting{
		parse: func(c *Config, path string) error {
			*field(c) = path
			if path == "" {
				return nil
			}
			f, err := os.Open(path)
			if err != nil {
				return fmt.Errorf("cannot read the file it names: %v", FileError(err))
			}
			defer f.Close()
			if st, err := f.Stat(); err == nil && st.IsDir() {
				// It exists, so it is a path, not a key pasted by mistake.
				return fmt.Errorf("names a directory, %s: want a file", path)
			}
			return nil
		},
		show: func(c *Config) slog.Value { return slog.StringValue(*field(c)) },
	}
}

// identitiesSetting reads a comma-separated list of caller identities.
func identitiesSetting(field func(*Config) *[]service.Identity) setting {
	return setting{
		parse: func(c *Config, v string) error { return parseIdentities(field(c), v) },
		show: func(c *Config) slog.Value {
			out := make([]string, len(*field(c)))
			for i, id := range *field(c) {
				out[i] = id.String()
			}
			return slog.AnyValue(out)
		},
	}
}

// parseIdentities parses a comma-separated list of identities into list.
// Its errors say which entry is wrong and what is wanted, without quoting
// it.
func parseIdentities(list *[]service.Identity, v string) error {
	var problems []error
	for i, entry := range strings.Split(v, ",") {
		entry = strings.TrimSpace(entry)
		switch {
		case entry == "":
		case strings.ContainsFunc(entry, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			problems = append(problems, fmt.Errorf("identity %d in the list has spaces or control characters; an identity has none", i+1))
		default:
			id, err := service.ParseIdentity(entry)
			if err != nil {
				problems = append(problems, fmt.Errorf("identity %d in the list: %w", i+1, err))
				continue
			}
			*list = append(*list, id)
		}
	}
	if v != "" && len(*list) == 0 && len(problems) == 0 {
		// Set, yet empty, it would turn the allowlist off (every caller
		// with a trusted certificate could call), or name no admin.
		return errors.New("set but holds no identity: want a comma-separated list of SPIFFE IDs or dns: names, or leave it unset")
	}
	return errors.Join(problems...)
}

// validHostname reports whether h has the shape of a DNS name: labels of
// letters, digits and hyphens, separated by dots.
func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}
