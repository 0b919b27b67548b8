/**
 * leasehold — long-running workers on at-least-once queues, in Effect.
 * Each module is one concept; see README.md for a tour.
 */
export * as EffectAi from "./adapters/EffectAi.js"
export * as ScriptedAdapter from "./adapters/ScriptedAdapter.js"
export * as Budget from "./Budget.js"
export * as Dataset from "./Dataset.js"
export * as DeadLetter from "./DeadLetter.js"
export * as Deadline from "./Deadline.js"
export * as EvalLoop from "./EvalLoop.js"
export * as Evaluator from "./Evaluator.js"
export * as Health from "./Health.js"
export * as Heartbeat from "./Heartbeat.js"
export * as InnerLoop from "./InnerLoop.js"
export * as LeaseExtender from "./LeaseExtender.js"
export * as Lifecycle from "./Lifecycle.js"
export * as Mailbox from "./Mailbox.js"
export * as MailboxMemory from "./MailboxMemory.js"
export * as MailboxSql from "./MailboxSql.js"
export * as MailboxWorker from "./MailboxWorker.js"
export * as MainLoop from "./MainLoop.js"
export * as Prompt from "./Prompt.js"
export * as ProviderAdapter from "./ProviderAdapter.js"
export * as Session from "./Session.js"
export * as Subagent from "./Subagent.js"
export * as Tool from "./Tool.js"
export * as ToolExecutor from "./ToolExecutor.js"
export * as Watchdog from "./Watchdog.js"
export * as WorkLease from "./WorkLease.js"
export * as WorkLeaseSql from "./WorkLeaseSql.js"

// The design names these two directly: `LoopGroup.make`, `ShutdownCoordinator.layer`.
export { LoopGroup, ShutdownCoordinator } from "./Lifecycle.js"
