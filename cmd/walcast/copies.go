package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
)

// broadcastFlags are the broadcast command's flags for try-acquire
// (R13.15), local-only broadcasts (R13.13), per-target copies (R13.10) and
// two-phase appends (R13.11).
type broadcastFlags struct {
	noWait, unreplicable bool
	copies, payloads     []string
	appendFirst          []string
}

func (b *broadcastFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&b.noWait, "no-wait", false, "fail at once, naming the holder, if a resource key is held (instead of queueing)")
	f.BoolVar(&b.unreplicable, "unreplicable", false, "local-only: this cluster's WAL only, never replicated, accepted on a secondary")
	f.StringArrayVar(&b.copies, "copy", nil, "give a target's copy a role: <vchannel>=<role> (repeat)")
	f.StringArrayVar(&b.payloads, "copy-payload", nil, "give a target's copy a payload of its own: <vchannel>=<text> (repeat)")
	f.StringArrayVar(&b.appendFirst, "append-first", nil, "append this target's copy, and wait for its ack, before the others (repeat)")
}

// apply sets the flags' fields of req.
func (b *broadcastFlags) apply(req *client.BroadcastRequest) error {
	req.NoWait, req.Unreplicable = b.noWait, b.unreplicable
	set := func(flag, spec string, fn func(*client.Copy, string)) error {
		v, val, ok := strings.Cut(spec, "=")
		if !ok || v == "" {
			return usageError{fmt.Errorf("--%s %q is not <vchannel>=<value>", flag, spec)}
		}
		if req.Copies == nil {
			req.Copies = map[message.VChannel]client.Copy{}
		}
		c := req.Copies[message.VChannel(v)]
		fn(&c, val)
		req.Copies[message.VChannel(v)] = c
		return nil
	}
	for _, s := range b.copies {
		if err := set("copy", s, func(c *client.Copy, role string) { c.Role = role }); err != nil {
			return err
		}
	}
	for _, s := range b.payloads {
		if err := set("copy-payload", s, func(c *client.Copy, p string) { c.Payload = []byte(p) }); err != nil {
			return err
		}
	}
	for _, v := range b.appendFirst {
		req.AppendFirst = append(req.AppendFirst, message.VChannel(v))
	}
	return nil
}

// printExtras prints what consumers returned with their acks (R13.12).
func printExtras(w io.Writer, extras map[message.VChannel][]byte) error {
	if len(extras) == 0 {
		return nil
	}
	vs := make([]string, 0, len(extras))
	for v := range extras {
		vs = append(vs, string(v))
	}
	slices.Sort(vs)
	tb := newTable(w, "VCHANNEL", "EXTRA")
	for _, v := range vs {
		tb.row(v, extraText(extras[message.VChannel(v)]))
	}
	return tb.flush()
}

// extraText shows a consumer's extra result: printable text as is (cut
// at 60 characters), anything else in hex; "-" for none.
func extraText(b []byte) string {
	if len(b) == 0 {
		return "-"
	}
	printable := utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return !unicode.IsPrint(r) })
	s := string(b)
	if !printable {
		s = "0x" + hex.EncodeToString(b)
	}
	if r := []rune(s); len(r) > 60 {
		s = string(r[:57]) + "..."
	}
	return s
}

// printTaskGroup prints a task's place in its group, if it has one (R13.1,
// R13.7).
func printTaskGroup(w io.Writer, t *walcastv1.Task) {
	g := t.GetGroup()
	if g == nil {
		return
	}
	word := "transaction"
	if g.GetOwnerKey() != "" {
		word = "owner " + g.GetOwnerKey()
	}
	id := g.GetId()
	if id == 0 {
		id = t.GetId() // a Begin's group is named by its own id
	}
	fmt.Fprintf(w, "group      %s %d, member %d (%s)\n", word, id, g.GetSeq(), kindWord(g.GetKind()))
	switch {
	case t.GetHoldsKeys():
		fmt.Fprintf(w, "holds      the group's keys until its end (walcast txn show %d)\n", id)
	case t.GetReleasedBy() != 0:
		fmt.Fprintf(w, "released   by broadcast %d\n", t.GetReleasedBy())
	}
}

// printTaskCopies prints a task's targets; the ROLE, PHASE and EXTRA
// columns only when a copy has a role, a first phase or an extra.
func printTaskCopies(w io.Writer, t *walcastv1.Task) error {
	more := slices.ContainsFunc(t.GetVchannels(), func(v *walcastv1.VChannelState) bool {
		return v.GetCopyRole() != "" || v.GetAppendFirst() || len(v.GetExtra()) > 0
	})
	header := []string{"VCHANNEL", "APPENDED", "ACKED", "MESSAGE ID", "TIME TICK"}
	if more {
		header = append(header, "ROLE", "PHASE", "EXTRA")
	}
	tb := newTable(w, header...)
	for _, v := range t.GetVchannels() {
		id, tick := checkpointCols(v.GetCheckpoint())
		row := []string{v.GetVchannel(), fmt.Sprint(v.GetAppended()), fmt.Sprint(v.GetAcked()), id, tick}
		if more {
			role, phase := v.GetCopyRole(), "2"
			if role == "" {
				role = "-"
			}
			if v.GetAppendFirst() {
				phase = "1"
			}
			row = append(row, role, phase, extraText(v.GetExtra()))
		}
		tb.row(row...)
	}
	return tb.flush()
}

// waitAckedCmd is "tasks wait-acked": wait for the copies of some targets
// to be acked (R13.11).
func waitAckedCmd(g *globals) *cobra.Command {
	var vchannels []string
	cmd := &cobra.Command{
		Use:   "wait-acked ID --vchannel V...",
		Short: "Wait until a task's copies on the given vchannels are acked (a two-phase append's first phase)",
		Long: `Wait until every copy of task ID on the given vchannels is acked by its consumer: the
first phase of a two-phase append (--append-first), or any partial set. It returns at
once for a finished task, and prints the task then (with the copies' extras). --timeout
bounds the wait.`,
		Example:           "  walcast tasks wait-acked 42 --vchannel wal-1/c7v0 --timeout 5m",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeTaskIDs(g, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			if len(vchannels) == 0 {
				return usageError{errors.New("--vchannel: name the copies to wait for (repeat)")}
			}
			vs := make([]message.VChannel, len(vchannels))
			for i, v := range vchannels {
				vs[i] = message.VChannel(v)
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*walcastv1.Task, error) {
				return c.WaitVChannelsAcked(ctx, id, vs...)
			}, func(w io.Writer, t *walcastv1.Task) error {
				fmt.Fprintf(w, "acked: %s of task %d\n", strings.Join(vchannels, " "), id)
				return printTask(w, t)
			})
		},
	}
	cmd.Flags().StringArrayVar(&vchannels, "vchannel", nil, "a target whose copy must be acked (repeat)")
	return cmd
}
