//go:build !paymentsd_testhooks

package config

// loadHooks reads what a test binary may change in paymentsd (see
// testhooks_on.go, built only with -tags paymentsd_testhooks). This build
// has none: every field is its zero value, which means "as in production".
func loadHooks(func(string) string, func(string, ...any)) Hooks { return Hooks{} }
