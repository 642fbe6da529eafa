package main

import "github.com/walcast/walcast/server"

// app is the application the server commands run.
func app() server.App { return server.GenericApp{} }
