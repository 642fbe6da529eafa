package main

import (
	"github.com/walcast/walcast/meta"
	"github.com/walcast/walcast/server"
)

// app is the application the server commands run: the reference metadata
// service (package meta), which also registers the generic types of
// server.GenericApp, configured from cfg (its pchannels and meta.*
// settings). Its importer ends with the process.
func app(cfg server.Config) (server.App, error) {
	a, err := meta.NewApp(meta.ConfigFrom(cfg))
	if err != nil {
		return nil, err
	}
	return a, nil
}
