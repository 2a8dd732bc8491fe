/*
 * A fault point for the tests: Hadoop's local filesystem for FileContext (what
 * fs.AbstractFileSystem.file.impl names; the stock one is org.apache.hadoop.fs.local.LocalFs)
 * whose rename onto a Delta commit file (<20 digits>.json) waits dcpcdc.test.rename.delay.ms
 * just before the rename(2) itself. Delta's stock log store for file: paths (HDFSLogStore)
 * checks that N.json does not exist, and Hadoop checks twice more on the way down (FileContext,
 * then FileSystem.rename with Rename.NONE); the wait comes after all three checks, so it holds a
 * writer in the window between the checks and the rename, where another JVM can pass the same
 * checks. Nothing else changes: every other call is LocalFs's.
 */
package dcpcdc.test;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.local.LocalConfigKeys;

public class SlowRenameLocalFs extends ChecksumFs {
    public static final String DELAY_MS = "dcpcdc.test.rename.delay.ms";

    public SlowRenameLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
        super(new SlowRenameRawLocalFs(uri, conf));
    }

    /** RawLocalFileSystem, waiting before it renames onto a commit file. */
    static final class SlowRenameFileSystem extends RawLocalFileSystem {
        private long delayMs;

        @Override
        public void initialize(URI uri, Configuration conf) throws IOException {
            super.initialize(uri, conf);
            delayMs = conf.getLong(DELAY_MS, 0);
        }

        @Override
        public boolean rename(Path src, Path dst) throws IOException {
            if (delayMs > 0 && dst.getName().matches("\\d{20}\\.json")) {
                try {
                    Thread.sleep(delayMs);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IOException("interrupted before renaming onto " + dst, e);
                }
            }
            return super.rename(src, dst);
        }
    }

    /** RawLocalFs (whose constructors are not public) over SlowRenameFileSystem. */
    static final class SlowRenameRawLocalFs extends DelegateToFileSystem {
        SlowRenameRawLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
            super(uri, new SlowRenameFileSystem(), conf, "file", false);
        }

        @Override
        public int getUriDefaultPort() {
            return -1;
        }

        @Override
        public FsServerDefaults getServerDefaults(Path f) throws IOException {
            return LocalConfigKeys.getServerDefaults();
        }

        @Override
        @Deprecated
        public FsServerDefaults getServerDefaults() throws IOException {
            return LocalConfigKeys.getServerDefaults();
        }

        @Override
        public boolean isValidName(String src) {
            return true;
        }
    }
}
