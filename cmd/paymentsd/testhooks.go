//go:build !paymentsd_testhooks

package main

// testHooks are what a test binary may change in paymentsd (see
// testhooks_on.go, built only with -tags paymentsd_testhooks). This build
// has none: every field is its zero value, which means "as in production".
type testHooks struct {
	hookValues
}

func loadTestHooks(func(string) string, func(string, ...any)) testHooks { return testHooks{} }
