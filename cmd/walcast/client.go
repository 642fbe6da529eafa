package main

import "github.com/spf13/cobra"

// clientCmds are the broadcast API's commands.
func clientCmds(*globals) []*cobra.Command { return nil }
