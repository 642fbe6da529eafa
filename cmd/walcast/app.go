package main

import (
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/meta"
	"github.com/walcast/walcast/server"
)

// newApp is the application the server commands run: the reference metadata
// service (package meta), which also registers the generic types of
// app.Generic, configured from cfg (its pchannels and meta.* settings). Its
// importer ends with the process.
func newApp(cfg server.Config) (app.App, error) {
	a, err := meta.NewApp(metaConfig(cfg))
	if err != nil {
		return nil, err
	}
	return a, nil
}

// metaConfig is the metadata service's configuration in a process
// configured by cfg: its pchannels, its meta.* settings and its logger.
func metaConfig(cfg server.Config) meta.Config {
	return meta.Config{
		PChannels:          cfg.PChannelNames(),
		CollectionShards:   cfg.Meta.CollectionShards,
		MaxImportJobNum:    cfg.Meta.MaxImportJobNum,
		ImportJobRetention: cfg.Meta.ImportJobRetention.D(),
		ImportRoot:         cfg.ImportRoot(),
		Logger:             cfg.Logger(),
	}
}
