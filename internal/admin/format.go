package admin

import (
	"fmt"
	"net"
	"strings"
)

// HumanBytes prints a size in binary units: 512 B, 1.5 KiB, 3.2 GiB (the
// CLI, the terminal console and the web console print sizes alike).
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// LoopbackHost reports whether a Host header names a loopback address
// (localhost, 127.0.0.0/8, ::1), with or without a port. The admin API and
// the web console answer token-less requests only for such a Host, so that
// a page whose own domain resolves to 127.0.0.1 (DNS rebinding) cannot use
// them.
func LoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
