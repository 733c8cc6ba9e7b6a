package daemon

import (
	"testing"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// A gateway's hold on a retried create's id fences the node: a create of
// that id without the claim (an earlier attempt arriving late) is
// refused Unavailable, as is another claim's hold, while a create
// carrying the claim passes; a hold step on a node that has the sandbox
// answers it and holds nothing; a released hold lets any create through.
// This is what makes a retry through another gateway exactly-once
// (docs/ARCHITECTURE.md, "Retried creates").
func TestClaimHoldFencesCreatesOfTheID(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	req := &warrenv1.CreateRequest{Image: "busybox", IdempotencyKey: "claimed", Retry: true}
	step := func(claim string, s warrenv1.ClaimStep) (*warrenv1.Sandbox, error) {
		r := proto.Clone(req).(*warrenv1.CreateRequest)
		r.Claim, r.ClaimStep = claim, s
		return e.m.Create(ctx, r)
	}
	if sb, err := step("c1", warrenv1.ClaimStep_CLAIM_STEP_HOLD); err != nil || sb.GetId() != "" {
		t.Fatalf("hold on a free id: %v %v, want an empty answer", sb, err)
	}
	if sb, err := step("c1", warrenv1.ClaimStep_CLAIM_STEP_HOLD); err != nil || sb.GetId() != "" {
		t.Fatalf("the same claim's hold again: %v %v", sb, err)
	}
	if _, err := step("c2", warrenv1.ClaimStep_CLAIM_STEP_HOLD); errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Fatalf("another claim's hold: %v, want Unavailable", err)
	}
	first := proto.Clone(req).(*warrenv1.CreateRequest)
	first.Retry = false
	if _, err := e.m.Create(ctx, first); errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Fatalf("a create without the claim of the held id: %v, want Unavailable", err)
	}
	if _, err := step("c2", warrenv1.ClaimStep_CLAIM_STEP_CREATE); errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Fatalf("a create with another claim: %v, want Unavailable", err)
	}
	sb, err := step("c1", warrenv1.ClaimStep_CLAIM_STEP_CREATE)
	if err != nil || sb.GetId() != IDForKey("", "claimed") {
		t.Fatalf("the create with the claim: %v %v", sb, err)
	}
	// Made: any hold step answers the sandbox, and the key's creates
	// answer it too.
	if got, err := step("c3", warrenv1.ClaimStep_CLAIM_STEP_HOLD); err != nil || got.GetId() != sb.GetId() {
		t.Fatalf("hold on a made id: %v %v, want the sandbox", got, err)
	}
	if got, err := e.m.Create(ctx, first); err != nil || got.GetId() != sb.GetId() {
		t.Fatalf("the key's create once made: %v %v", got, err)
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: sb.GetId()}); err != nil {
		t.Fatal(err)
	}

	// Release: only the holder's, then the id is free again.
	if _, err := step("c4", warrenv1.ClaimStep_CLAIM_STEP_HOLD); err != nil {
		t.Fatal(err)
	}
	if _, err := step("c5", warrenv1.ClaimStep_CLAIM_STEP_RELEASE); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(ctx, first); errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Fatalf("another claim's release dropped the hold: %v", err)
	}
	if _, err := step("c4", warrenv1.ClaimStep_CLAIM_STEP_RELEASE); err != nil {
		t.Fatal(err)
	}
	sb, err = e.m.Create(ctx, first)
	if err != nil {
		t.Fatalf("a create after the hold's release: %v", err)
	}
	if _, err := e.m.Delete(ctx, &warrenv1.DeleteRequest{Id: sb.GetId()}); err != nil {
		t.Fatal(err)
	}
	if len(e.m.holds) != 0 {
		t.Fatalf("holds left: %v", e.m.holds)
	}
	if _, err := e.m.BatchCreate(ctx, &warrenv1.BatchCreateRequest{Count: 1, Template: &warrenv1.CreateRequest{Image: "busybox", ClaimStep: warrenv1.ClaimStep_CLAIM_STEP_HOLD, Claim: "x"}}); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("a batch template with a claim: %v, want Invalid", err)
	}
}
