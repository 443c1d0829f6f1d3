package taskid_test

import (
	"fmt"
	"strings"

	"github.com/faultrouter/faultrouter/pkg/taskid"
)

// The same contract, user and action give the same ID on every machine and
// every run; the same refund approved twice gets two IDs through its
// authorizations. These outputs are test vectors for other implementations
// (the Python in the package doc prints them too).
func Example() {
	contract := []byte("contract v3, page 1-12")
	fmt.Println(taskid.FromContent(contract, "alice@example.com", "contract_review", ""))
	id, _ := taskid.FromReader(strings.NewReader("contract v3, page 1-12"), "alice@example.com", "contract_review", "")
	fmt.Println(id)

	refund := []byte("refund order 1042: 30.00 EUR")
	fmt.Println(taskid.FromContent(refund, "bob", "refund", "approval-7"))
	fmt.Println(taskid.FromContent(refund, "bob", "refund", "approval-8"))
	// Output:
	// t1-gbfytwymocayisfkuruu2svjbz
	// t1-gbfytwymocayisfkuruu2svjbz
	// t1-rhgyilbfsftetuosfewamku4e6
	// t1-gdalaw3wc4m6xwex7avyee27z6
}
