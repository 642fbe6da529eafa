package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// txnCmd is "walcast txn": broadcast transactions (R13.1), one set of
// resource keys held from a Begin to its Commit or Rollback across separate
// commands.
func txnCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "txn",
		Short: "Broadcast transactions: begin, body, commit, rollback, show, list",
		Long: `A broadcast transaction holds one set of resource keys across several broadcasts: its
Begin (which takes the keys and fixes the targets), bodies, and a Commit or a Rollback
(which releases them). Each step is its own command, so a transaction can span
processes and coordinator restarts: pass the id "txn begin" prints to the others.

"txn begin --scope ... --client-key K" is idempotent: repeating it returns the
transaction it opened, without waiting for its keys. Members take the transaction's
targets and keys; give them --scope and --client-key too to make a repeat an answer
from the original (a repeated commit gets the commit's result even after the
transaction ended). "txn show" and "txn list" show open groups: transactions, and the
ownerships of resource-key owners (an import's).`,
	}
	cmd.AddCommand(txnBeginCmd(g), txnMemberCmd(g, "body", walcastv1.GroupKind_GROUP_KIND_BODY), txnMemberCmd(g, "commit", walcastv1.GroupKind_GROUP_KIND_COMMIT),
		txnMemberCmd(g, "rollback", walcastv1.GroupKind_GROUP_KIND_ROLLBACK), txnShowCmd(g), txnListCmd(g))
	return cmd
}

// memberFlags are the flags of a transaction's message: its type, payload
// and idempotency.
type memberFlags struct {
	typ, payload, payloadFile, scope, clientKey string
}

func (m *memberFlags) add(cmd *cobra.Command, g *globals) {
	f := cmd.Flags()
	f.StringVar(&m.typ, "type", "Generic.v1", "message type <name>.v<version>")
	f.StringVar(&m.payload, "payload", "", "payload (a string)")
	f.StringVar(&m.payloadFile, "payload-file", "", "read the payload from a file")
	f.StringVar(&m.scope, "scope", "", "idempotency scope: cluster, db:<id> or collection:<id>")
	f.StringVar(&m.clientKey, "client-key", "", "idempotency client key (minted if --scope is set without it)")
	completeTypes(cmd, "type", g)
}

// parse returns the message's type, payload and scope, minting a client key
// for a scope without one (so that the output can name it).
func (m *memberFlags) parse() (message.Type, []byte, client.Scope, error) {
	t, err := message.ParseType(m.typ)
	if err != nil {
		return t, nil, client.Scope{}, usageError{fmt.Errorf("--type: %w", err)}
	}
	body := []byte(m.payload)
	if m.payloadFile != "" {
		if m.payload != "" {
			return t, nil, client.Scope{}, usageError{errors.New("--payload and --payload-file: give one")}
		}
		if body, err = os.ReadFile(m.payloadFile); err != nil {
			return t, nil, client.Scope{}, usageError{err}
		}
	}
	sc, err := parseScope(m.scope)
	if err != nil {
		return t, nil, sc, usageError{err}
	}
	if sc == (client.Scope{}) && m.clientKey != "" {
		return t, nil, sc, usageError{errors.New("--client-key needs --scope")}
	}
	if sc != (client.Scope{}) && m.clientKey == "" {
		m.clientKey = client.NewRequestKey()
	}
	return t, body, sc, nil
}

func txnBeginCmd(g *globals) *cobra.Command {
	var (
		m         memberFlags
		vchannels []string
		keys      []string
		noWait    bool
	)
	cmd := &cobra.Command{
		Use:   "begin --vchannel V... --key K...",
		Short: "Open a transaction: broadcast its Begin, take its keys, print its id",
		Long: `Open a transaction: its Begin broadcast takes the resource keys (--key) and names the
targets of every member (--vchannel; the control channel is added). The command returns
once the Begin's callback ran; the keys stay held until "txn commit" or "txn rollback".
--no-wait fails at once (exit 1, naming the holder) if a key is held, instead of queueing.`,
		Example: `  walcast txn begin --type Generic.v1 --payload import-7 --vchannel wal-1/c1v0 --key 'Collection:db1:c1@X' \
      --scope collection:1 --client-key import-7`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, body, sc, err := m.parse()
			if err != nil {
				return err
			}
			if len(vchannels) == 0 {
				return usageError{errors.New("--vchannel: name the transaction's targets (repeat)")}
			}
			req := &client.BeginTxnRequest{Type: t, Payload: body, Scope: sc, ClientKey: m.clientKey, NoWait: noWait}
			for _, v := range vchannels {
				req.VChannels = append(req.VChannels, message.VChannel(v))
			}
			for _, k := range keys {
				rk, err := resource.Parse(k)
				if err != nil {
					return usageError{fmt.Errorf("--key: %w", err)}
				}
				req.ResourceKeys = append(req.ResourceKeys, rk)
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*client.Txn, error) {
				x, err := c.BeginTxn(ctx, req)
				if errors.Is(err, client.ErrBusy) {
					return nil, busyHint(err)
				}
				return x, err
			}, func(w io.Writer, x *client.Txn) error {
				fmt.Fprintf(w, "transaction %d open", x.ID)
				if x.Duplicated {
					fmt.Fprint(w, " (a repeat: answered by the transaction it opened)")
				}
				fmt.Fprintf(w, "; its keys are held until `walcast txn commit %d` or `walcast txn rollback %d`\n", x.ID, x.ID)
				fmt.Fprintf(w, "begin outcome %s\n", outcomeString(x.Begin.Outcome))
				if req.ClientKey != "" {
					fmt.Fprintf(w, "client key %q (repeat the command with it to get this transaction again)\n", req.ClientKey)
				}
				return nil
			}, func(x *client.Txn) any {
				return object{"txn_id": x.ID, "duplicated": x.Duplicated, "begin": newBroadcastOutput(&client.BroadcastRequest{ClientKey: req.ClientKey}, x.Begin).value()}
			})
		},
	}
	m.add(cmd, g)
	f := cmd.Flags()
	f.StringArrayVar(&vchannels, "vchannel", nil, "target vchannel <pchannel>/<name> of every member (repeat)")
	f.StringArrayVar(&keys, "key", nil, "resource key <Domain>:<name>@R|X held until the end (repeat)")
	f.BoolVar(&noWait, "no-wait", false, "fail at once, naming the holder, if a key is held")
	return cmd
}

// txnMemberCmd is "txn body", "txn commit" or "txn rollback".
func txnMemberCmd(g *globals, use string, kind walcastv1.GroupKind) *cobra.Command {
	var m memberFlags
	short := map[walcastv1.GroupKind]string{
		walcastv1.GroupKind_GROUP_KIND_BODY:     "Broadcast a body of an open transaction (its targets, under its keys)",
		walcastv1.GroupKind_GROUP_KIND_COMMIT:   "Commit a transaction: broadcast its Commit and release its keys",
		walcastv1.GroupKind_GROUP_KIND_ROLLBACK: "Roll a transaction back: broadcast its Rollback and release its keys",
	}[kind]
	cmd := &cobra.Command{
		Use:   use + " TXN-ID",
		Short: short,
		Long: short + `. The message goes to the transaction's targets and carries its keys;
the command returns once its callback ran. Members take effect in order. The first
end wins: a commit after a rollback (or the reverse) fails; with --scope/--client-key a
repeated end gets the first one's result.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeGroupIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseTxnID(args[0])
			if err != nil {
				return err
			}
			t, body, sc, err := m.parse()
			if err != nil {
				return err
			}
			req := &client.TxnMemberRequest{Type: t, Payload: body, Scope: sc, ClientKey: m.clientKey}
			call := map[walcastv1.GroupKind]func(*client.Client, context.Context, uint64, *client.TxnMemberRequest) (*client.BroadcastResult, error){
				walcastv1.GroupKind_GROUP_KIND_BODY:     (*client.Client).TxnBody,
				walcastv1.GroupKind_GROUP_KIND_COMMIT:   (*client.Client).CommitTxn,
				walcastv1.GroupKind_GROUP_KIND_ROLLBACK: (*client.Client).RollbackTxn,
			}[kind]
			breq := &client.BroadcastRequest{ClientKey: req.ClientKey}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*broadcastOutput, error) {
				res, err := call(c, ctx, id, req)
				if err != nil {
					return nil, err
				}
				return newBroadcastOutput(breq, res), nil
			}, func(w io.Writer, o *broadcastOutput) error {
				fmt.Fprintf(w, "transaction %d: %s is ", id, use)
				return printBroadcast(w, o)
			}, func(o *broadcastOutput) any { return with(o.value().(object), "txn_id", id, "kind", use) })
		},
	}
	m.add(cmd, g)
	return cmd
}

// busyHint says what to do after a --no-wait refusal.
func busyHint(err error) error {
	return fmt.Errorf("%w\nnothing was created: retry later, or without --no-wait to queue for the key (walcast locks shows its holders)", err)
}

func parseTxnID(s string) (uint64, error) {
	id, err := parseID(s)
	if err != nil {
		return 0, usageError{fmt.Errorf("transaction id %q is not a positive integer", s)}
	}
	return id, nil
}

func txnShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show an open transaction (or ownership): its keys, targets, members and end",
		Long: `Show an open group: a transaction, or the ownership of a resource-key owner. It lists
the keys it holds, its targets, its members in order with their stages, and its
Commit or Rollback once one was sent. A group that ended is refused (see its tasks
with "walcast tasks show").`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeGroupIDs(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseTxnID(args[0])
			if err != nil {
				return err
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*walcastv1.Group, error) {
				return c.GetGroup(ctx, id)
			}, printGroup)
		},
	}
}

func txnListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List open transactions and ownerships",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*walcastv1.ListGroupsResponse, error) {
				gs, err := c.ListGroups(ctx)
				return &walcastv1.ListGroupsResponse{Groups: gs}, err
			}, func(w io.Writer, r *walcastv1.ListGroupsResponse) error {
				tb := newTable(w, "ID", "KIND", "HOLDING", "MEMBERS", "ENDING", "KEYS")
				for _, gr := range r.GetGroups() {
					tb.row(fmt.Sprint(gr.GetId()), groupWord(gr), holdingWord(gr), fmt.Sprint(len(gr.GetMembers())), endingWord(gr),
						strings.Join(gr.GetResourceKeys(), " "))
				}
				return tb.flush()
			})
		},
	}
}

// groupWord says what a group is: "transaction" or "owner <key>".
func groupWord(gr *walcastv1.Group) string {
	if k := gr.GetOwnerKey(); k != "" {
		return "owner " + k
	}
	return "transaction"
}

func holdingWord(gr *walcastv1.Group) string {
	switch {
	case gr.GetHolding() && gr.GetHoldsHere():
		return "yes"
	case gr.GetHolding():
		return "yes (not here: a secondary's)"
	}
	return "not yet"
}

func endingWord(gr *walcastv1.Group) string {
	if gr.GetEndingId() == 0 {
		return "-"
	}
	return fmt.Sprintf("%s %d", kindWord(gr.GetEndingKind()), gr.GetEndingId())
}

// kindWord is a group kind as a word: begin, body, commit, rollback.
func kindWord(k walcastv1.GroupKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "GROUP_KIND_"))
}

func printGroup(w io.Writer, gr *walcastv1.Group) error {
	fmt.Fprintf(w, "%s %d\n", groupWord(gr), gr.GetId())
	fmt.Fprintf(w, "holding    %s\nkeys       %s\ntargets    %s\nending     %s\n", holdingWord(gr), strings.Join(gr.GetResourceKeys(), " "),
		strings.Join(gr.GetVchannels(), " "), endingWord(gr))
	if n := gr.GetQueued(); n > 0 {
		fmt.Fprintf(w, "queued     %d members wait to be created\n", n)
	}
	fmt.Fprintln(w)
	tb := newTable(w, "SEQ", "MEMBER", "KIND", "STAGE")
	for _, m := range gr.GetMembers() {
		tb.row(fmt.Sprint(m.GetSeq()), fmt.Sprint(m.GetId()), kindWord(m.GetKind()), m.GetStage())
	}
	return tb.flush()
}

// completeGroupIDs completes the ids of open groups.
func completeGroupIDs(g *globals) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return g.ask(cmd, func(ctx context.Context, c *client.Client) ([]string, error) {
			gs, err := c.ListGroups(ctx)
			out := make([]string, 0, len(gs))
			for _, gr := range gs {
				out = append(out, fmt.Sprintf("%d\t%s", gr.GetId(), groupWord(gr)))
			}
			return out, err
		})
	}
}
