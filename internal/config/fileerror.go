package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// FileError is err, from opening or reading a file, saying where its path
// leads without repeating it unless it exists: a variable meant to name a
// file may hold a key pasted by mistake, which must not be printed, but a
// path that exists on this machine is no secret. For a path that doesn't
// exist it names the nearest directory above it that does, which tells a
// mount in the wrong place from a file name mistyped.
func FileError(err error) error {
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		return err
	}
	path := pe.Path
	if _, statErr := os.Stat(path); statErr == nil {
		return fmt.Errorf("%s %s: %w", pe.Op, path, pe.Err)
	}
	abs, absErr := filepath.Abs(path)
	if absErr != nil {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	dir := filepath.Dir(abs)
	for {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return fmt.Errorf("%s: %w (the nearest directory on its path that exists is %s)", pe.Op, pe.Err, dir)
}
