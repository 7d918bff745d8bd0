//go:build tools

// Package tools pins the commands this module builds.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
