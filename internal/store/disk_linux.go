package store

import (
	"fmt"
	"path/filepath"
	"syscall"
)

// diskAvailable returns the bytes available to an unprivileged process on
// the volume holding path.
func diskAvailable(path string) (int64, bool, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(path), &st); err != nil {
		return 0, false, fmt.Errorf("free space on the database's volume: %w", err)
	}
	return int64(st.Bavail) * st.Bsize, true, nil
}
