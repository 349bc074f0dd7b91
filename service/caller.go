package service

import "context"

// CallerFromContext returns the calling service's identity, or "".
func CallerFromContext(ctx context.Context) string { return "" }
