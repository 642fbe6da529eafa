package main

import (
	"net"
	"os"
)

// sdNotify sends state to systemd's notification socket (sd_notify(3)) when
// the process runs under a unit of Type=notify (NOTIFY_SOCKET is set), and
// does nothing otherwise. Errors are ignored, as sd_notify's callers do: a
// lost notification only delays the unit's start, which systemd bounds.
func sdNotify(state string) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return
	}
	if path[0] == '@' { // an abstract socket
		path = "\x00" + path[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return
	}
	defer conn.Close()
	_, _ = conn.Write([]byte(state))
}
