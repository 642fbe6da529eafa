package resource_test

import (
	"context"
	"fmt"

	"github.com/walcast/walcast/resource"
)

// ExampleLocker takes the keys of a CreateIndex (its database shared, its
// collection exclusive): they are taken in the lock order whatever order
// they are given in, a conflicting TryLock fails at once, and one on
// another collection of the database does not conflict.
func ExampleLocker() {
	l := resource.NewLocker()
	g, err := l.Lock(context.Background(), resource.ExclusiveCollection("shop", "orders"), resource.SharedDatabase("shop"))
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", g.Keys())
	if _, err := l.TryLock(resource.ExclusiveCollection("shop", "orders")); err != nil {
		fmt.Println("orders busy:", err != nil)
	}
	other, err := l.TryLock(resource.SharedDatabase("shop"), resource.ExclusiveCollection("shop", "refunds"))
	fmt.Println("refunds:", err == nil)
	other.Unlock()
	g.Unlock()
	// Output:
	// held: [Collection:shop:orders@X Database:shop@R]
	// orders busy: true
	// refunds: true
}

// ExampleParse reads resource keys as the API and the CLI take them.
func ExampleParse() {
	for _, s := range []string{"Collection:db1:c1@X", "Database:db1@R", "Cluster:@X", "Cluster:foo@R"} {
		k, err := resource.Parse(s)
		if err != nil {
			fmt.Println(s, "refused:", err)
			continue
		}
		fmt.Printf("%s %q %s\n", k.Domain, k.Name, k.Mode)
	}
	// Output:
	// Collection "db1:c1" X
	// Database "db1" R
	// Cluster "" X
	// Cluster:foo@R refused: resource: invalid key: the Cluster domain has one key, the empty name; got "foo"
}
