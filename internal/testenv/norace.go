//go:build !race

package testenv

// RaceEnabled reports whether the binary was built with -race, whose
// instrumentation allocates: allocation counts measured under it are not
// the program's.
const RaceEnabled = false
