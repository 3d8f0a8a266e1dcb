// Package mqtest states, once, the behaviour the rest of a process relies on from an
// [mq.Broker], as a conformance suite any broker can run. This is its author's guide:
// write a harness, run it, read a failure.
//
// Cases address events only by [mq.Topic] (tenant, table, optional scope), never by
// stream, subject or partition, so a broker passes by behaving correctly, not by
// copying another broker's layout. Where two brokers may legitimately differ, a
// capability flag in [Caps] says which way, and every flag is checked by behaviour in
// both directions: declaring true for something that does not work, or false for
// something that does, fails a case. [Cases] lists every case with what it proves, the
// hooks and flags it uses and what it publishes; the repository's README has the same
// table.
//
// # Write a harness
//
// A broker author writes one test that calls [Run] with a [Harness] (see the example
// of Run for a whole file):
//
//	func TestMyBroker_Conformance(t *testing.T) {
//		mqtest.Run(t, mqtest.Harness{
//			New:                  newBroker,               // required: a fresh, isolated broker per case
//			EndDelivery:          deleteDurable,           // optional: end delivery of mqtest.Durable from outside
//			Fill:                 mqtest.FillByPublishing, // optional: make the tenant's next Publish ErrQueueFull
//			DeadLetters:          readParked,              // optional: read parked events back
//			Restart:              reopen,                  // optional: close and reopen on the same store
//			TooLarge:             64 << 20,                // optional: a payload size refused (0: 8 MiB)
//			ReservedHeaderPrefix: "My-",                   // the header names the broker keeps for itself
//			Caps:                 mqtest.Caps{PerTenantBudget: true /* ... */},
//		})
//	}
//
// The hooks, each one the suite cannot perform through the [mq.Broker] interface:
//
//   - New (required) returns a fresh broker that shares nothing with any other New
//     returned (a case may run two), with [Acme] and [Globex] budgeted at 64 MiB
//     each, and registers its cleanup on t. The cleanup must tolerate a broker the
//     case already closed. Cases budget any further tenant themselves.
//   - EndDelivery ends delivery of [Durable] under a running Consume from outside, as
//     an operator or the network could (delete the durable, or drop the connection for
//     good); the consumer must then report once on its failed channel. Nil skips the
//     cases that need it.
//   - Fill makes the tenant's next Publish of any event, the empty one on table "t"
//     included, fail with mq.ErrQueueFull. [FillByPublishing] does it for any broker
//     that enforces budgets; write your own only to fill another way. Nil skips the
//     cases that need it.
//   - DeadLetters reads a tenant's parked events back, in park order. Nil skips only
//     the assertions on parked contents; the counts are always checked.
//   - Restart closes the broker as a host does at a deploy and returns one opened
//     again on the same store (for a client of an external server: a new client after
//     the server restarted), and registers that broker's cleanup on t as New does.
//     New must keep each broker's store (its directory) where Restart finds it: see
//     the example of [Harness]. Nil skips the restart cases.
//   - TooLarge is a payload size the broker refuses with mq.ErrPayloadTooLarge; it
//     must be above the broker's limit (a 256 KiB payload must be accepted).
//   - ReservedHeaderPrefix names the headers the broker keeps for itself ("Nats-" for
//     the NATS brokers): the suite checks they are refused and that every other name
//     round-trips. Empty means the broker reserves none.
//   - WaitScale multiplies the suite's waits (below).
//
// A case that needs a nil hook is skipped with a message naming the hook. The Health
// cases run only for a broker that implements [mq.HealthChecker], the dead-letter
// workflow case only for an [mq.DeadLetterManager]. The zero [Caps] is a claim too:
// every false flag is checked as false, so start from the true behaviour of the
// broker, not from the zero value.
//
// # Run it
//
//	go test -run 'TestMyBroker_Conformance' ./mybroker            # every case
//	go test -run 'TestMyBroker_Conformance/RoundTrip$' ./mybroker # one case
//	go test -race -parallel 16 -run 'TestMyBroker_Conformance' ./mybroker
//
// Every case runs as a parallel subtest on its own broker, so go test's -parallel
// bounds how many run at once (GOMAXPROCS by default); the cases mostly wait on the
// broker, so a higher -parallel makes a run several times faster (EmbeddedNATS on 2
// cores: 47 s by default, 8 s with -parallel 16, measured).
//
// # The wait scale
//
// No case asserts how fast anything is; a delay the case configured (a RetryDelay) is
// checked only as a lower bound between two calls. The suite still has windows: a wait
// for something that should happen gives up after 5 s with no progress; something
// that must not happen is watched for 300 ms; the cases that need the ack wait to
// redeliver set an AckWait of 200 ms; a restart case leaves the broker idle 2 s before
// restarting it, and each restart adds 30 s to the case's context. All five scale by
// [Harness.WaitScale] times the environment variable
// MQTEST_WAIT_SCALE (each 1 when unset). The scale is there so that a slow machine
// does not pass for a slow broker: on a loaded machine (-race, a high -parallel on few
// cores, a busy CI runner) a handler's ack can take longer than 200 ms to reach the
// broker, so an event comes back that the case says must not, and a broker starved of
// CPU can leave 5 s with nothing delivered. A failure such as "then nothing for 5s"
// or an unexpected redelivery that comes and goes with the load is the sign: run such
// machines with a scale above 1, for example
//
//	MQTEST_WAIT_SCALE=3 go test -race -parallel 16 -run 'TestMyBroker_Conformance' ./mybroker
//
// and treat a failure that stays at a generous scale as the broker's. A scale below 1
// makes a failing case fail sooner.
//
// # What the suite does not check
//
// The suite does not look for goroutines a broker leaves running after Close (a
// forgotten ticker, a reader of a closed connection): a broker that leaks passes. Run
// the conformance test under go.uber.org/goleak to catch them: goleak.VerifyTestMain
// in TestMain, or a check once a subtest wrapping Run has ended (Run returns before its
// parallel cases run; the subtest ends after them and their cleanups, the brokers'
// Close among them):
//
//	func TestMyBroker_Conformance(t *testing.T) {
//		before := goleak.IgnoreCurrent() // what ran before the suite is not its leak
//		t.Run("suite", func(t *testing.T) { mqtest.Run(t, harness) })
//		goleak.VerifyNone(t, before)
//	}
//
// [Run] installs the W3C TraceContext propagator as the global OpenTelemetry text-map
// propagator for the duration of the run (the trace cases need it) and restores the
// previous one afterwards. Because that is global state, Run must not be called from a
// parallel test, nor alongside other tests that read or set the global propagator.
//
// # Read a failure
//
// A failure is reported under the case's subtest, TestMyBroker_Conformance/<Name>:
// look the name up in [Cases] (or the README's table) for what the case proves, what it
// published and which hooks and flags it relied on. The message says which path
// failed (consume, subscribe, replay) and what was expected, for example
//
//	consume: the headers of "keyed": expected ... actual ...
//	waiting for 3 deliveries: got 2 deliveries, then nothing for 5s: ["acme/one" "globex/one"]
//
// the second meaning an event the case expected never arrived. A failure that depends
// on a flag names it: "Caps.X is false, yet ..." when the broker did what a true flag
// declares, "Caps.X: ..." when it did not do what the flag claims. Either the flag is
// wrong for the broker or the broker is wrong for the flag; the case's Proves says
// which behaviour each value stands for.
package mqtest
