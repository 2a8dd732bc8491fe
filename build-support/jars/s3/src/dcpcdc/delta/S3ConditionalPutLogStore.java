/*
 * A Delta Lake log store for S3 (s3a://) that is safe with several writers (drivers) at once.
 *
 * Delta commits version N of a table by writing <table>/_delta_log/<N>.json and needs that
 * write to fail when the file already exists: two writers that both think N is next must not
 * both succeed. Delta's default S3 log store (S3SingleDriverLogStore) checks for the file and
 * then writes it under a lock held in its own JVM only, so two drivers can both write N and one
 * commit is lost. This one writes the commit with S3's conditional PUT (If-None-Match: *),
 * through Hadoop S3A's create option fs.option.create.conditional.overwrite (hadoop-aws 3.4.2
 * and later): S3 itself refuses the second write, and the loser gets the
 * java.nio.file.FileAlreadyExistsException Delta turns into a retry of the commit at N+1 (or
 * a typed conflict). Nothing besides the bucket is needed (no DynamoDB table).
 *
 * Use: spark.delta.logStore.s3a.impl = dcpcdc.delta.S3ConditionalPutLogStore (pipelines.s3
 * sets it). Built by `make setup-s3` (build-support/jars/s3/build_logstore.py).
 */
package dcpcdc.delta;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;

import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

public class S3ConditionalPutLogStore extends HadoopFileSystemLogStore {

    /** Hadoop S3A's createFile() option: PUT with If-None-Match: *. */
    public static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

    public S3ConditionalPutLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public void write(
            Path path,
            Iterator<String> actions,
            Boolean overwrite,
            Configuration hadoopConf) throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path).overwrite(overwrite);
        if (!overwrite) {
            // must(): a filesystem that cannot write conditionally fails here, never silently.
            builder = builder.must(CONDITIONAL_CREATE, true);
        }
        try (FSDataOutputStream stream = builder.build()) {
            while (actions.hasNext()) {
                stream.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
            }
        } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
            throw alreadyExists(path, e);
        } catch (IOException e) {
            if (!overwrite && preconditionFailed(e)) {
                throw alreadyExists(path, e);
            }
            throw e;
        }
    }

    /** An S3 object is visible whole or not at all. */
    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;
    }

    private static java.nio.file.FileAlreadyExistsException alreadyExists(
            Path path, IOException cause) {
        java.nio.file.FileAlreadyExistsException e =
            new java.nio.file.FileAlreadyExistsException(path.toString());
        e.initCause(cause);
        return e;
    }

    /** S3's answer to a conditional PUT that lost: HTTP 412 Precondition Failed (or 409
     * ConditionalRequestConflict while another conditional write of the key is in flight). */
    private static boolean preconditionFailed(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof org.apache.hadoop.fs.s3a.RemoteFileChangedException) {
                return true;
            }
            String text = String.valueOf(t.getMessage());
            if (text.contains("412") || text.contains("PreconditionFailed")
                    || text.contains("ConditionalRequestConflict")) {
                return true;
            }
        }
        return false;
    }
}
