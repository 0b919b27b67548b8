/** The worker loops' metrics (re-exported by `MailboxWorker`, whose public module documents them). */
import { counter } from "../metrics.js"

/**
 * Messages handled, by outcome.
 *
 * @category metrics
 */
export const messagesProcessed = counter("leasehold_messages_processed_total", "Messages whose handler succeeded")

/**
 * Messages whose handler failed.
 *
 * @category metrics
 */
export const messagesFailed = counter("leasehold_messages_failed_total", "Messages whose handler failed")

/**
 * Messages whose handler was interrupted (a shutdown's timeout) and that were given back.
 *
 * @category metrics
 */
export const messagesInterrupted = counter(
  "leasehold_messages_interrupted_total",
  "Messages whose handler was interrupted (shutdown timeout) and that were given back"
)

/**
 * Messages received again (`deliveryCount > 1`): another attempt at work that did not settle.
 *
 * @category metrics
 */
export const messagesRedelivered = counter(
  "leasehold_messages_redelivered_total",
  "Messages received with deliveryCount > 1"
)

/**
 * Loops that died (their fiber failed), by loop name.
 *
 * @category metrics
 */
export const loopFailures = counter("leasehold_loop_failures_total", "Worker loops that died with an error")
