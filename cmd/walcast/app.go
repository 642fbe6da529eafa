package main

import (
	"net/http"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/meta"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/server"
)

// appConfig is the configuration the running server command loaded
// (loadConfig records it): the meta application takes its pchannels and
// meta.* settings from it.
var appConfig = server.Default()

// configured records a configuration loadConfig read successfully.
func configured(c server.Config, err error) (server.Config, error) {
	if err == nil {
		appConfig = c
	}
	return c, err
}

// app is the application the server commands run: the reference metadata
// service (package meta), which also registers the generic types of
// server.GenericApp. Its importer ends with the process.
func app() server.App {
	a, err := meta.NewApp(meta.ConfigFrom(appConfig))
	if err != nil {
		return failedApp{err}
	}
	return a
}

// failedApp reports an application that could not be built when the
// process registers it, so the server command fails with the reason.
type failedApp struct{ err error }

func (f failedApp) Register(*message.Registry, *broadcast.Callbacks) error { return f.err }
func (failedApp) Handlers(server.Leader) map[string]http.Handler           { return nil }
func (failedApp) Applier(string) node.Applier                              { return &server.CountingApplier{} }
