package devcluster

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
)

// Network places a cluster's members each in its own network namespace,
// joined by veth pairs to a bridge, so that tests can cut the links between
// them for real (SPEC R9.12's partition test bed). It needs root, `ip` with
// network namespaces and, for faults other than a link down, `nft`
// (Debian's nftables).
//
// The bridge lives in the network namespace of the process that calls
// NewNetwork, the hub, which gets the address 10.77.0.1/24; member i gets
// 10.77.0.(10+i). Nothing is added to the machine's own namespace, as long
// as the hub is not it: a test runs itself again in a namespace of its own
// (see Hub) and builds the network from there. Member namespaces are named
// <prefix>-<member>.
//
// Faults are nftables rules in a member's namespace that drop packets from
// or to other members' addresses (a partition: connections hang, nothing
// is refused), and the member's link set down (every connection of the
// member hangs). Heal removes a member's rules and sets its link up.
type Network struct {
	prefix string

	mu    sync.Mutex
	hosts map[string]string // member name → address; protected by mu
	links map[string]string // member name → hub-side veth; protected by mu
}

// Subnet and hub address of every test-bed network (each lives in its own
// namespaces, so two test beds never collide).
const (
	netPrefix = "10.77.0."
	hubAddr   = netPrefix + "1"
)

// ErrNoNamespaces reports a machine where the test bed cannot be built
// (not root, no `ip netns`, no nft).
var ErrNoNamespaces = errors.New("devcluster: network namespaces unavailable")

// run runs a command and returns its error with its output.
func run(args ...string) error {
	cmd := exec.Command(args[0], args[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// runInput runs a command with input on its standard input.
func runInput(input string, args ...string) error {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = strings.NewReader(input)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s\n%s", strings.Join(args, " "), err, strings.TrimSpace(out.String()), input)
	}
	return nil
}

// CreateHub creates the network namespace name (for a process to run
// in, with `ip netns exec`, and build a Network from), with its loopback
// up. It fails with ErrNoNamespaces where namespaces or nft are missing.
func CreateHub(name string) error {
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %s not found (Debian: iproute2, nftables)", ErrNoNamespaces, tool)
		}
	}
	if err := run("ip", "netns", "add", name); err != nil {
		return fmt.Errorf("%w: %w", ErrNoNamespaces, err)
	}
	if err := run("ip", "-n", name, "link", "set", "lo", "up"); err != nil {
		_ = run("ip", "netns", "del", name)
		return fmt.Errorf("%w: %w", ErrNoNamespaces, err)
	}
	return nil
}

// DeleteNamespaces deletes every network namespace whose name starts with
// prefix: what a test bed left, whatever happened to it.
func DeleteNamespaces(prefix string) error {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return err
	}
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if name != "" && strings.HasPrefix(name, prefix) {
			errs = append(errs, run("ip", "netns", "del", name))
		}
	}
	return errors.Join(errs...)
}

// NewNetwork creates the bridge in the calling process's namespace (the
// hub) and returns a network whose member namespaces are named
// <prefix>-<member>.
func NewNetwork(prefix string) (*Network, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("%w: nft not found (Debian: nftables)", ErrNoNamespaces)
	}
	for _, args := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "wcbr0", "type", "bridge"},
		{"ip", "addr", "add", hubAddr + "/24", "dev", "wcbr0"},
		{"ip", "link", "set", "wcbr0", "up"},
	} {
		if err := run(args...); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoNamespaces, err)
		}
	}
	return &Network{prefix: prefix, hosts: map[string]string{}, links: map[string]string{}}, nil
}

// namespace is a member's namespace name.
func (n *Network) namespace(member string) string { return n.prefix + "-" + member }

// add creates a member's namespace, its veth pair to the bridge and its
// address, and returns the address.
func (n *Network) add(member string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h, ok := n.hosts[member]; ok {
		return h, nil
	}
	host := fmt.Sprintf("%s%d", netPrefix, 10+len(n.hosts))
	ns, link := n.namespace(member), fmt.Sprintf("wcv%d", len(n.hosts))
	for _, args := range [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"ip", "link", "set", link, "master", "wcbr0", "up"},
		{"ip", "-n", ns, "addr", "add", host + "/24", "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
	} {
		if err := run(args...); err != nil {
			return "", fmt.Errorf("%w: member %s: %w", ErrNoNamespaces, member, err)
		}
	}
	// A table per member for the faults, empty until one is injected.
	if err := runInput(`table inet walcast {
	chain in { type filter hook input priority 0; }
	chain out { type filter hook output priority 0; }
}
`, "ip", "netns", "exec", ns, "nft", "-f", "-"); err != nil {
		return "", fmt.Errorf("%w: member %s: %w", ErrNoNamespaces, member, err)
	}
	n.hosts[member], n.links[member] = host, link
	return host, nil
}

// Host is a member's address ("" for a member not in the network).
func (n *Network) Host(member string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.hosts[member]
}

// command is the command line that runs argv in a member's namespace.
func (n *Network) command(member string, argv ...string) []string {
	return append([]string{"ip", "netns", "exec", n.namespace(member)}, argv...)
}

// rules appends nftables rules to a member's table.
func (n *Network) rules(member string, rules ...string) error {
	if n.Host(member) == "" {
		return fmt.Errorf("devcluster: %s is not in the network", member)
	}
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "add rule inet walcast %s\n", r)
	}
	return runInput(b.String(), n.command(member, "nft", "-f", "-")...)
}

// addrs returns the addresses of members, the hub's for "hub".
func (n *Network) addrs(members []string) ([]string, error) {
	var out []string
	for _, m := range members {
		if m == "hub" {
			out = append(out, hubAddr)
			continue
		}
		h := n.Host(m)
		if h == "" {
			return nil, fmt.Errorf("devcluster: %s is not in the network", m)
		}
		out = append(out, h)
	}
	return out, nil
}

// Cut drops every packet between member and each of others, both ways.
// "hub" names the test's own process.
func (n *Network) Cut(member string, others ...string) error {
	addrs, err := n.addrs(others)
	if err != nil {
		return err
	}
	set := "{ " + strings.Join(addrs, ", ") + " }"
	return n.rules(member, "in ip saddr "+set+" drop", "out ip daddr "+set+" drop")
}

// CutFrom drops the packets member receives from each of others: a
// one-way cut (member still sends to them; their answers are lost).
func (n *Network) CutFrom(member string, others ...string) error {
	addrs, err := n.addrs(others)
	if err != nil {
		return err
	}
	return n.rules(member, "in ip saddr { "+strings.Join(addrs, ", ")+" } drop")
}

// LinkDown sets a member's link down: every packet to or from it is lost.
func (n *Network) LinkDown(member string) error {
	n.mu.Lock()
	link := n.links[member]
	n.mu.Unlock()
	if link == "" {
		return fmt.Errorf("devcluster: %s is not in the network", member)
	}
	return run("ip", "link", "set", link, "down")
}

// Heal removes a member's cuts and sets its link up.
func (n *Network) Heal(member string) error {
	n.mu.Lock()
	link := n.links[member]
	n.mu.Unlock()
	if link == "" {
		return fmt.Errorf("devcluster: %s is not in the network", member)
	}
	return errors.Join(
		runInput("flush chain inet walcast in\nflush chain inet walcast out\n", n.command(member, "nft", "-f", "-")...),
		run("ip", "link", "set", link, "up"))
}

// HealAll heals every member.
func (n *Network) HealAll() error {
	n.mu.Lock()
	members := make([]string, 0, len(n.hosts))
	for m := range n.hosts {
		members = append(members, m)
	}
	n.mu.Unlock()
	slices.Sort(members)
	var errs []error
	for _, m := range members {
		errs = append(errs, n.Heal(m))
	}
	return errors.Join(errs...)
}

// Close deletes the members' namespaces (their links go with them) and
// the bridge.
func (n *Network) Close() error {
	err := DeleteNamespaces(n.prefix + "-")
	return errors.Join(err, run("ip", "link", "del", "wcbr0"))
}
