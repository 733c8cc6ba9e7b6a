// Package placement chooses the node for a new sandbox. It is pure Go with
// no I/O: the gateway feeds it node reports (Update, Down, Remove) and asks
// it for placements (Place, PlaceN); transport and membership live in the
// gateway.
//
// # What it promises
//
//   - A placement only lands on a node that is up and fits the request:
//     CPU and memory allocated plus the request stay within capacity times
//     the over-commit ratio, and the sandbox count within MaxSandboxes.
//     If no node fits, Place returns an errdefs.Exhausted error; it never
//     refuses while some up node fits (a failed sample falls back to a scan).
//   - A placement reserves the request on its node at once, so the next
//     placement sees it without waiting for the node's next report. The
//     reservation also marks the image's layers as arriving on that node,
//     which is what image locality and new-image spreading read.
//   - A placement costs O(K + L) (K sampled candidates, L image layers),
//     not O(nodes), and Placer is safe for many concurrent callers.
//
// # How a node is chosen
//
// Candidates are K nodes sampled uniformly from the up nodes (power of K
// choices) plus up to K nodes that hold the image's most specific layer
// found in the layer index. Each candidate that fits is scored:
//
//	score = wFree·free − wLoad·load + wLoc·locality − wQoS·qos − wAnti·anti
//
// free is 1 minus the larger of the CPU and memory utilisation after the
// request (against over-committed capacity, and the sandbox cap); load is
// the run queue per core, saturating at 2; locality is the fraction of the
// image's layers (by bytes when sizes are given) the node has. Layers a
// node reports (mounted there) always count, however few nodes have the
// image: a placement there saves the mount and finds the page cache warm.
// Layers only arriving (sent there by a placement, not yet reported) count
// once the image is on spreadTarget (3) nodes, so a burst of creates of an
// image no node has lands on three different nodes before placements
// start following it. Holders win until they are wLoc/wFree (60 points)
// fuller than a node without the image, which is how a popular image
// spreads to more nodes. qos keeps latency-sensitive ("ls")
// sandboxes off nodes busy with best-effort ("be") load, and packs "be" with
// "be", so the nodes LS sandboxes run on keep short run queues. anti counts
// the sandboxes on the node carrying any of the request's anti-affinity
// labels; when every sampled candidate carries one, more are sampled (a
// bounded number of rounds) before accepting the least bad.
//
// # Reservations and reports
//
// A node's report replaces its reported state; reservations are kept in two
// generations, the one since the last report and the one before it, and a
// report retires the older. A create placed just before a report may not be
// in it (the create had not landed when the node wrote it), so a reservation
// is counted until the second report after it: at worst one report interval
// of double counting, never an under-count of a create in flight. Release
// takes a reservation back (a create that failed, or a sandbox that ended
// before the next report).
package placement
