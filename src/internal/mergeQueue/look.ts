/**
 * The merge queue as it is, for an operator's look (`leasehold queue …`, the console): no migration, no
 * version check and nothing written while opening — its reads and `detectAndRecoverStale` work on the tables
 * of any version — and `TablesNotFoundError` without the tables (a wrong database or prefix).
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import * as Effect from "effect/Effect"
import type * as ParseResult from "effect/ParseResult"
import type { TablesNotFoundError } from "../../Errors.js"
import * as Options_ from "../options.js"
import type { MergeQueueStoreError } from "./errors.js"
import { MergeQueueConfig, type MergeQueueService } from "./model.js"
import * as Service from "./service.js"

const decodeOptions = Options_.classDecoder("MergeQueue.make", MergeQueueConfig)

/** Opens the queue of `prefix` for a look. */
export const look = (options: { readonly prefix?: string | undefined }): Effect.Effect<
  MergeQueueService,
  MergeQueueStoreError | ParseResult.ParseError | TablesNotFoundError,
  SqlClient.SqlClient
> =>
  Effect.flatMap(
    decodeOptions({ ...options, create: false }),
    (config) =>
      Service.make(config, "look") as Effect.Effect<
        MergeQueueService,
        MergeQueueStoreError | TablesNotFoundError,
        SqlClient.SqlClient
      >
  )
